//! The whole cluster's migdra devices, read from the API server's objects: what `usage` draws and
//! what `why` explains. Pure: the objects are read at the CLI's edge.
//!
//! - [`wire`]: the slice fields they read, parsed lean.
//! - [`model`]: pools, GPUs and devices, the claims holding them, and the shared counters left.
//! - [`cel`]: the CEL selectors operators write, evaluated exactly or said to be unsupported.
//! - [`nodes`]: the Node side: the scheduler's node filters for a pod, nodes opted in that publish
//!   nothing.
//! - [`usage`]: per GPU who holds which memory slice; per profile what is free now.
//! - [`why`]: per request of a pending claim, what keeps each GPU from it.

pub mod cel;
pub mod model;
pub mod nodes;
pub mod usage;
pub mod why;
pub mod wire;
