//! Packing: which placement the scheduler gives a request, given the order migdra publishes its
//! devices in, and which order packs best. Pure: no I/O, deterministic for a seed.
//!
//! The scheduler's DRA allocator takes the **first device that fits**, walking slices and then
//! each slice's devices in published order, with no scoring (`docs/facts/dra-allocator-order.md` §1, §2).
//! The slices of a pool come in a random order on 1.34 and 1.35 (a new one for every pod), and
//! sorted by name from 1.36. So the published order decides the placement, and with it how
//! fragmented the GPUs get.
//!
//! - [`allocator`]: the node's allocations, the counter check (exactly [`crate::mig::counters`]) and
//!   the allocator: first fit over slices in random or name order.
//! - [`policy`]: device orders: (a) ascending placements (NVIDIA's driver, the anchor), (b) a
//!   static order that packs small profiles from the end of the GPU and keeps the start free for
//!   large ones, (c) re-ranked after every change so first fit is best fit, (d) (c) plus steering
//!   by omission on 1.34/1.35: free placements of a profile are published only on the GPU that
//!   fits it best, while every allocated device stays published.
//!
//! The studies that measure these orders (the reference churn workload, and Slurm's choice of GPU
//! for shard jobs) live beside the bench that prints them, in `benches/packing/`: the daemon runs
//! only [`policy::order_devices`].

pub mod allocator;
pub mod policy;

pub use allocator::{Dev, Node, SliceOrder};
pub use policy::{DeviceOrder, Policy};
