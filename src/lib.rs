//! migdra: a Kubernetes DRA kubelet plugin for NVIDIA MIG GPUs.
//!
//! # Layout
//! - [`mig`]: the pure domain (catalog, placement rules, device names, counters). No I/O.
//! - [`gpu`]: the hardware boundary, a [`gpu::GpuBackend`] trait with a simulator.
//! - [`cli`]: the `migdra` subcommands.

pub mod cli;
pub mod gpu;
pub mod mig;
