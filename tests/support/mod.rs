//! The integration harness: every test that runs `migdra` as a process, and the bench, build it
//! through here, so each starts from the same environment and the same directory layout.
//!
//! - [`command`]: `migdra` with the caller's environment scrubbed of everything migdra reads.
//! - [`node`]: one simulated node's temporary directories, and the CLI pointed at them.
//! - [`daemon`]: `migdra serve` on a node; waits for registration, shows its log when a test fails.
//! - [`claim`]: ResourceClaims as the API server returns them, and the kubelet's reference to one.
//! - [`eventually`]: poll a condition until a deadline, failing with what was awaited.
//! - [`logs`]: the tail of a child's log for a failure message.
//! - [`skip`]: what a test that cannot run here prints, or the failure `MIGDRA_REQUIRE_*` asks for.
//! - [`render`]: `kustomize build` and `helm template` of daemonset/, the binaries found alike.
//! - [`background`]: wait for a build `.ci/run` runs in the background (the bridge, the image).
//! - [`fake_apiserver`], [`fake_nvml`], [`controlplane`], [`cluster`], [`kubelet_code`],
//!   [`slurm`], [`kubenode`], [`bridge`]: the other side of each tier: a fake API server, a fake
//!   libnvidia-ml, a real control plane and what the tests put in it, the kubelet's own code, a
//!   real Slurm, a real node (kubelet binary, containerd, runc), the real slurm-bridge.
//!
//! Test files include it with `mod support;` (`#[path = "../tests/support/mod.rs"]` from
//! benches/ and tests/reliability/). Each binary compiles it on its own and uses only part of it,
//! so unused items are expected and must not fail `clippy -D warnings`.
#![allow(dead_code)]

pub mod background;
pub mod bridge;
pub mod claim;
pub mod cluster;
pub mod command;
pub mod controlplane;
pub mod daemon;
pub mod eventually;
pub mod fake_apiserver;
pub mod fake_nvml;
pub mod kubelet_code;
pub mod kubenode;
pub mod logs;
pub mod node;
pub mod render;
pub mod skip;
pub mod slurm;

/// The driver name every test node publishes under (migdra's default).
pub const DRIVER: &str = "mig.slinky.slurm.net";
/// The node name, and so the pool name, of a test node.
pub const NODE: &str = "node-a";
/// The namespace test claims live in.
pub const NAMESPACE: &str = "team-a";
