//! Packing studies, beside the bench that prints them (item 5 of `benches/bench.rs`): the
//! reference churn workload through the scheduler's first-fit model (`migdra::packing`), and
//! Slurm's choice of GPU for shard jobs. The daemon runs none of it, only the device order.
//! `tests/library/` includes this module too, so its unit tests run with the pure ones.
#![allow(dead_code)] // each includer uses a part

pub mod churn;
pub mod shards;
