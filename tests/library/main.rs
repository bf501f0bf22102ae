//! Pure-library tests: migdra's library called in the test process, or files read; no process started.
//! One test binary for the tier, one module per file in `tests/library/`: each binary links the whole
//! dependency tree, so fewer of them build and link faster.

#[path = "../support/mod.rs"]
mod support;

mod alerts;
mod chart;
mod conformance;
mod counter_proof;
mod docs;
mod harness;
mod layers;
mod manifests;
mod prepare;
mod sim_props;
// The packing studies of benches/packing/ (pure: the crate's packing model): their unit tests.
#[path = "../../benches/packing/mod.rs"]
mod study;
