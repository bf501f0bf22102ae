//! A test that cannot run here says so in one line that `hack/test.sh` counts as skipped, or fails
//! when the variable that requires it is `1` (`.ci/run` sets every one): nothing skips silently.
#![allow(dead_code)] // tests/library/manifests.rs includes this file alone and needs one constant

/// `MIGDRA_REQUIRE_SLURM=1`: a missing Slurm fails the test.
pub const SLURM: &str = "MIGDRA_REQUIRE_SLURM";
/// `MIGDRA_REQUIRE_RENDERS=1`: a missing kustomize or helm fails the test.
pub const RENDERS: &str = "MIGDRA_REQUIRE_RENDERS";
/// `MIGDRA_REQUIRE_BRIDGE=1`: missing slurm-bridge binaries (hack/build-bridge.sh) fail the test.
pub const BRIDGE: &str = "MIGDRA_REQUIRE_BRIDGE";
/// `MIGDRA_REQUIRE_PROMTOOL=1`: a missing promtool (hack/build-promtool.sh) fails the test.
pub const PROMTOOL: &str = "MIGDRA_REQUIRE_PROMTOOL";
/// `MIGDRA_REQUIRE_ROOT=1`: a refused mount or mknod fails the test.
pub const ROOT: &str = "MIGDRA_REQUIRE_ROOT";

/// Skips what needs `require` (one of the constants above), printing `SKIPPED` and why; panics
/// instead when `require` is set to `1`.
#[allow(clippy::print_stdout)]
pub fn skip(require: &str, why: &str) {
    assert!(std::env::var(require).as_deref() != Ok("1"), "required here ({require}=1): {why}");
    println!("SKIPPED (set {require}=1 to fail instead): {why}");
}
