//! Pure-library tests: migdra's library called in the test process, or files read; no process started.
//! One test binary for the tier, one module per file in `tests/library/`: each binary links the whole
//! dependency tree, so fewer of them build and link faster.

#[path = "support/mod.rs"]
mod support;

#[path = "library/chart.rs"]
mod chart;
#[path = "library/conformance.rs"]
mod conformance;
#[path = "library/counter_proof.rs"]
mod counter_proof;
#[path = "library/docs.rs"]
mod docs;
#[path = "library/harness.rs"]
mod harness;
#[path = "library/layers.rs"]
mod layers;
#[path = "library/manifests.rs"]
mod manifests;
#[path = "library/prepare.rs"]
mod prepare;
#[path = "library/sim_props.rs"]
mod sim_props;
// The packing studies of benches/packing/ (pure: the crate's packing model): their unit tests.
#[path = "../benches/packing/mod.rs"]
mod study;
