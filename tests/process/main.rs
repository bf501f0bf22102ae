//! One-process tests: the `migdra` binary, alone or as `migdra serve` with a test kubelet on its sockets.
//! One test binary for the tier, one module per file in `tests/process/`: each binary links the whole
//! dependency tree, so fewer of them build and link faster.

#[path = "../support/mod.rs"]
mod support;

mod cli;
mod cli_live;
// The crash points exist only with the feature (hack/test.sh passes it).
#[cfg(feature = "crash-points")]
mod claims_crash;
mod demo;
mod kubelet;
mod metrics;
mod nvml;
mod probe;
mod slices;
