//! migdra: a Kubernetes DRA kubelet plugin for NVIDIA MIG GPUs.
//!
//! # Layout
//! - [`mig`]: the pure domain (catalog, placement rules, device names, counters). No I/O.
//! - [`gpu`]: the hardware boundary, a [`gpu::GpuBackend`] trait with a simulator and the NVML
//!   backend (the crate's only unsafe code, in `gpu::nvml`).
//! - [`state`]: the checkpoint, the durable record of every claim's progress.
//! - [`cdi`]: CDI spec files, one per claim, exposing only the prepared devices.
//! - [`claims`]: where prepare finds a claim's allocation ([`claims::ClaimSource`]: the API server,
//!   or a directory of ResourceClaim files).
//! - [`prepare`]: the prepare/unprepare state machine, per-GPU locks, rollback, recovery, cleanup.
//! - [`slurm`]: each GPU's Slurm index (admin map, `slurmd -G`, gres.conf emulation, NVML order)
//!   and shards.
//! - [`kube`]: the Kubernetes side: ResourceSlices (both layouts), the publisher, claim lookup,
//!   claim status, events, and every API call in one list.
//! - [`kubelet`]: the kubelet's gRPC APIs over Unix sockets.
//! - [`metrics`]: the Prometheus endpoint of `migdra serve` (off by default).
//! - [`packing`]: the scheduler's first fit as a model, and the device orders `--device-order`
//!   publishes (the studies that compare them are in benches/packing/).
//! - [`cluster`]: what `kubectl migdra usage` and `why` read: the cluster's slices and claims as
//!   the scheduler sees them, and a CEL evaluator for the selectors the project writes.
//! - [`daemon`]: `migdra serve` as a library type: the engine, the kubelet's sockets, the
//!   publisher and the periodic tasks under one supervisor, from a config until shutdown.
//! - [`cli`]: the `migdra` subcommands; each turns flags into a call.
//! - [`causes`], [`duration`], [`files`], [`names`]: errors as one line, one parser for
//!   durations, durable writes and owned directories, and Kubernetes' name rules: the primitives
//!   every layer above shares.

pub mod causes;
pub mod cdi;
pub mod claims;
pub mod cli;
pub mod cluster;
pub mod daemon;
pub mod duration;
pub mod files;
pub mod gpu;
pub mod kube;
pub mod kubelet;
pub mod metrics;
pub mod mig;
pub mod names;
pub mod packing;
pub mod pci;
pub mod prepare;
pub mod slurm;
pub mod state;
