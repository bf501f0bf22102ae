//! The pure MIG domain: GPU models, NVML's placement rules, device names, counters and the DRA
//! devices a GPU offers. Nothing here does I/O, so all of it is tested exhaustively.

pub mod catalog;
mod models;
pub mod rules;
pub mod counters;
pub mod naming;
pub mod proof;
pub mod devices;
