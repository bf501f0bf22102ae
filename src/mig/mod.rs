//! The pure MIG domain: GPU models, NVML's placement rules, device names, counters and the DRA
//! devices a GPU offers. Nothing here does I/O, so all of it is tested exhaustively.

pub mod allowlist;
pub mod catalog;
pub mod counters;
pub mod devices;
pub mod discovered;
pub mod fit;
mod models;
pub mod naming;
mod profile;
pub mod proof;
pub mod rules;
pub mod taints;
