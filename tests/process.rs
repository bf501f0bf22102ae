//! One-process tests: the `migdra` binary, alone or as `migdra serve` with a test kubelet on its sockets.
//! One test binary for the tier, one module per file in `tests/process/`: each binary links the whole
//! dependency tree, so fewer of them build and link faster.

#[path = "support/mod.rs"]
mod support;

#[path = "process/cli.rs"]
mod cli;
#[path = "process/cli_live.rs"]
mod cli_live;
// The crash points exist only with the feature (hack/test.sh passes it).
#[cfg(feature = "crash-points")]
#[path = "process/claims_crash.rs"]
mod claims_crash;
#[path = "process/demo.rs"]
mod demo;
#[path = "process/kubelet.rs"]
mod kubelet;
#[path = "process/metrics.rs"]
mod metrics;
#[path = "process/nvml.rs"]
mod nvml;
#[path = "process/probe.rs"]
mod probe;
#[path = "process/slices.rs"]
mod slices;
