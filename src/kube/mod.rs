//! The Kubernetes side: what this node publishes to the API server, where claims come from, and
//! what the bridge reads back.
//!
//! - [`slices`]: the pure ResourceSlice builder and the API server's validation rules for them,
//!   in both layouts (counters beside devices before 1.35, in their own slices from 1.35).
//! - [`inventory`]: the node's GPUs as the slice builder takes them, read from the prepare engine.
//! - [`publisher`]: publishes the slices and repairs drift.
//! - [`claims`]: the claim source backed by the API server.
//! - [`status`]: the claim status writer (`status.devices[]` with Ready and the bridge's data).
//! - [`events`]: Warning events on failed claims and on the Node.

pub mod claims;
pub mod events;
pub mod inventory;
pub mod publisher;
pub mod slices;
pub mod status;
