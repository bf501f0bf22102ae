//! `migdra` as a child process that sees none of the caller's settings: a test run from a shell
//! with `NODE_NAME` or `MIGDRA_*` exported behaves as it does on CI.

use serde_json::Value;
use std::ffi::OsStr;
use std::process::{Command, Output};

/// Every environment variable migdra reads (clap `env` attributes and `std::env::var` calls in
/// src/, the kube client's in-cluster configuration), and the fake libnvidia-ml's. tests/library/harness.rs
/// checks that src/ reads no other.
pub const SCRUBBED: &[&str] = &[
    // Global flags (src/cli/mod.rs, src/cli/slurmflags.rs).
    "MIGDRA_SIM",
    "MIGDRA_SIM_STATE",
    "MIGDRA_NVML_LIB",
    "MIGDRA_DRIVER_ROOT",
    "MIGDRA_PROCFS_ROOT",
    "MIGDRA_SYSFS_ROOT",
    "MIGDRA_HOST_ROOT",
    "MIGDRA_OUTPUT",
    "MIGDRA_DRIVER_NAME",
    "NODE_NAME",
    "MIGDRA_PLUGIN_DIR",
    "MIGDRA_REGISTRY_DIR",
    "MIGDRA_STATE_DIR",
    "MIGDRA_CDI_DIR",
    "MIGDRA_CLAIMS_DIR",
    "MIGDRA_MIG_MODE",
    "MIGDRA_MIG_MODE_OVERRIDE",
    "MIGDRA_ORPHANS",
    "MIGDRA_SLICE_LAYOUT",
    "MIGDRA_DEVICE_ORDER",
    "MIGDRA_PUBLISH",
    "MIGDRA_DEVICE_NAMES",
    "MIGDRA_PROFILES",
    "MIGDRA_UNHEALTHY_TAINT_EFFECT",
    "KUBECONFIG",
    "MIGDRA_SLURM_INDEX_MAP",
    "MIGDRA_SLURM_CONF",
    "MIGDRA_SLURM_GRES_CONF",
    "MIGDRA_SLURMD",
    "MIGDRA_SLURM_NODE_NAME",
    "MIGDRA_SHARDS_PER_GPU",
    // `serve`, `profiles` and `slices` flags.
    "POD_UID",
    "MIGDRA_HEALTH",
    "MIGDRA_HEALTH_INTERVAL",
    "MIGDRA_GRACE",
    "MIGDRA_PROBE_TIMEOUT",
    "MIGDRA_SOCKET_CHECK",
    "MIGDRA_RESYNC",
    "MIGDRA_LOG_FORMAT",
    "MIGDRA_LOG_LEVEL",
    "MIGDRA_METRICS_ADDR",
    "MIGDRA_METRICS_ALLOW_REMOTE",
    "MIGDRA_MODEL",
    "MIGDRA_GENERATION",
    "MIGDRA_NODE_UID",
    // `slurm-conf` and `device-classes` flags.
    "MIGDRA_DEV_ROOT",
    "MIGDRA_GRES_TYPE",
    "MIGDRA_CLASS_PREFIX",
    "MIGDRA_EXTENDED_RESOURCE_PREFIX",
    "MIGDRA_GPU_EXTENDED_RESOURCE",
    // Read directly: the simulator's faults and the crash points.
    "MIGDRA_SIM_FAULTS",
    "MIGDRA_CRASH_AT",
    // kube::Config::infer, when `serve` has no --kubeconfig: the in-cluster configuration.
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
];

/// Scrubbed by prefix as well, so a variable added to src/ before this list is still cleared:
/// migdra's own and the fake libnvidia-ml's (`FAKE_NVML_STATE`, `FAKE_NVML_TRACE`, …).
pub const SCRUBBED_PREFIXES: &[&str] = &["MIGDRA_", "FAKE_NVML_"];

/// Variables src/ reads that a child keeps: where to find the programs it runs.
pub const INHERITED: &[&str] = &["PATH"];

/// `program` with every [`SCRUBBED`] variable, and every inherited one with a
/// [`SCRUBBED_PREFIXES`] prefix, removed from its environment. A test sets what it means to
/// with `Command::env` afterwards.
pub fn scrubbed(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    for name in SCRUBBED {
        cmd.env_remove(name);
    }
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(|n| SCRUBBED_PREFIXES.iter().any(|p| n.starts_with(p))) {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// The `migdra` binary of this build, [`scrubbed`].
pub fn migdra() -> Command {
    scrubbed(env!("CARGO_BIN_EXE_migdra"))
}

/// This build's `migdra` as the kubectl plugin `DIR/kubectl-migdra` (made once); the directory
/// to put on kubectl's PATH.
pub fn kubectl_plugin(dir: &std::path::Path) -> std::path::PathBuf {
    let plugin = dir.join("kubectl-migdra");
    if !plugin.exists() {
        std::fs::create_dir_all(dir).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_migdra"), &plugin).unwrap();
    }
    plugin
}

/// The program and its arguments, for a failure message (`Command`'s own `Debug` lists every
/// removed variable too).
pub fn describe(cmd: &Command) -> String {
    let mut out = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        out.push(' ');
        out.push_str(&a.to_string_lossy());
    }
    out
}

/// Running a command that must succeed.
pub trait Run {
    /// Runs it to the end; its output, whatever the exit status.
    fn run(&mut self) -> Output;
    /// Runs it to the end; its stdout. Panics, with the command, its stdout and stderr, unless
    /// it exits 0.
    fn ok(&mut self) -> String;
    /// [`Run::ok`], parsed as JSON.
    fn json(&mut self) -> Value;
}

impl Run for Command {
    fn run(&mut self) -> Output {
        self.output().unwrap_or_else(|e| panic!("{}: {e}", describe(self)))
    }

    fn ok(&mut self) -> String {
        let out = self.run();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{} failed ({}):\n{stdout}\n{}",
            describe(self),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    fn json(&mut self) -> Value {
        let text = self.ok();
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} printed no JSON ({e}):\n{text}", describe(self)))
    }
}
