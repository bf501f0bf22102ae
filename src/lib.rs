//! migdra: a Kubernetes DRA kubelet plugin for NVIDIA MIG GPUs.
//!
//! # Layout
//! - [`mig`]: the pure domain (catalog, placement rules, device names, counters). No I/O.
//! - [`gpu`]: the hardware boundary, a [`gpu::GpuBackend`] trait with a simulator.
//! - [`state`]: the checkpoint, the durable record of every claim's progress.
//! - [`cdi`]: CDI spec files, one per claim, exposing only the prepared devices.
//! - [`claims`]: where prepare finds a claim's allocation ([`claims::ClaimSource`]; a directory of
//!   ResourceClaim files for now).
//! - [`kube`]: the Kubernetes side; for now the ResourceSlices of this node's pool
//!   ([`kube::slices`]: both layouts, the API's limits and name rules).
//! - [`metrics`]: the Prometheus endpoint of `migdra serve` (off by default).
//! - [`packing`]: the scheduler's first fit as a model, device orders, and a churn workload to
//!   compare them.
//! - [`cli`]: the `migdra` subcommands.

pub mod cdi;
pub mod claims;
pub mod cli;
pub mod gpu;
pub mod kube;
pub mod kubelet;
pub mod metrics;
pub mod mig;
pub mod packing;
pub mod prepare;
pub mod slurm;
pub mod state;
