//! The fake libnvidia-ml (`hack/fake-nvml`) for tests: built once per test binary with the
//! same cargo and profile as the tests (so it reuses their artifacts), and copied once per
//! simulated node, so each node is its own loaded library with its own settings file.
//!
//! On NVML a prepare checks the host's device nodes (`--host-root`, `/` by default), which this
//! machine lacks: each node gets its own under `host/dev` (mknod, so as root), or, where mknod
//! is refused, `--host-root none`.

use super::command::migdra;
use super::node::{NodeDir, make_device_nodes};
use migdra::gpu::GpuBackend;
use migdra::gpu::nvml::{NvmlBackend, NvmlOptions};
use migdra::gpu::procfs::Procfs;
use migdra::gpu::sim::{SimBackend, SimSpec};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The `nvidia-caps` major the fake's procfs tree has (the simulator itself reports 508).
pub const FAKE_CAPS_MAJOR: u32 = 238;

/// `libfake_nvml.so`, built on first use with `cargo build --profile test -p fake-nvml`.
///
/// # Panics
/// When the build fails; the message carries cargo's errors.
pub fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(build)
}

fn build() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    // What cargo sets for this test process (CARGO_PKG_NAME, CARGO_MANIFEST_DIR, ...) is not passed
    // on: build scripts watch those names (ring's does), so this build and the next `cargo test`
    // would each rebuild ring and all that depends on it (35 s a time in a cold CI run).
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_by_cargo =
            ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_", "CARGO_CFG_"].iter().any(|p| name.starts_with(p))
                || [
                    "CARGO_CRATE_NAME",
                    "CARGO_PRIMARY_PACKAGE",
                    "CARGO_TARGET_TMPDIR",
                    "CARGO_RUSTC_CURRENT_DIR",
                    "OUT_DIR",
                ]
                .contains(&name.as_ref());
        if set_by_cargo {
            command.env_remove(name.as_ref());
        }
    }
    let out = command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["build", "--locked", "--profile", "test", "-p", "fake-nvml", "--message-format", "json"])
        .output()
        .expect("run cargo to build hack/fake-nvml");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "building hack/fake-nvml failed:\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "fake_nvml")
        .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().map(PathBuf::from))
        .find(|f| f.extension().is_some_and(|e| e == "so"))
        .expect("cargo reported no libfake_nvml.so")
}

/// A simulated node behind its own copy of the fake library.
pub struct FakeNode {
    /// The node's directories; `migdra` on it goes through NVML.
    pub node: NodeDir,
    /// The simulator state file: the hardware.
    pub state: PathBuf,
    /// The procfs tree the fake keeps.
    pub procfs: PathBuf,
    /// This node's copy of the library, as `libnvidia-ml.so.1`.
    pub lib: PathBuf,
    /// `--sysfs-root`: where each GPU sits, as the simulator places it ([`write_sysfs`]).
    pub sysfs: PathBuf,
    /// `--host-root`: a directory holding the GPUs' device nodes, or `none`.
    pub host_root: PathBuf,
    /// Every NVML function called through this copy, one per line.
    pub trace: PathBuf,
    /// The same hardware, driven directly: what a test changes behind NVML's back.
    pub hw: SimBackend,
}

impl FakeNode {
    /// A node with these GPUs (`--sim` syntax).
    pub fn new(spec: &str) -> Self {
        Self::with(spec, &[])
    }

    /// A node with extra `fake-nvml.conf` settings (`profile-info-version`, `unlisted`).
    pub fn with(spec: &str, settings: &[(&str, &str)]) -> Self {
        let node = NodeDir::new();
        let state = node.sim_state();
        let procfs = node.path().join("proc");
        let trace = node.path().join("trace");
        let hw = SimBackend::open(&state, Some(&SimSpec::parse(spec).expect("spec"))).expect("simulator");
        let libdir = node.path().join("lib");
        std::fs::create_dir_all(&libdir).unwrap();
        let lib = libdir.join("libnvidia-ml.so.1");
        std::fs::copy(library(), &lib).expect("copy the fake library");
        let mut conf = format!("state={}\nprocfs={}\ntrace={}\n", state.display(), procfs.display(), trace.display());
        for (k, v) in settings {
            conf.push_str(&format!("{k}={v}\n"));
        }
        std::fs::write(libdir.join("fake-nvml.conf"), conf).unwrap();
        let sysfs = node.path().join("sys");
        write_sysfs(&sysfs, &hw.gpus().expect("the simulator's GPUs"));
        let host = node.path().join("host");
        let minors: Vec<u64> = hw.gpus().expect("the simulator's GPUs").iter().map(|g| u64::from(g.minor)).collect();
        let host_root = if make_device_nodes(&host, &minors) { host } else { PathBuf::from("none") };
        let node = node.nvml(lib.clone(), procfs.clone(), sysfs.clone()).host_root(&host_root);
        FakeNode { node, state, procfs, sysfs, lib, trace, host_root, hw }
    }

    /// `migdra` on this node's NVML alone (the library and its procfs tree), no other flags.
    pub fn migdra(&self) -> Command {
        let mut cmd = migdra();
        cmd.arg("--nvml-lib")
            .arg(&self.lib)
            .arg("--procfs-root")
            .arg(&self.procfs)
            .arg("--sysfs-root")
            .arg(&self.sysfs);
        cmd.arg("--host-root").arg(&self.host_root);
        cmd
    }

    pub fn options(&self, watch_events: bool) -> NvmlOptions {
        NvmlOptions {
            lib_path: Some(self.lib.clone()),
            driver_root: None,
            procfs: Procfs::new(&self.procfs),
            watch_events,
            sysfs_root: Some(self.sysfs.clone()),
        }
    }

    /// The NVML backend on this node.
    pub fn open(&self, watch_events: bool) -> NvmlBackend {
        NvmlBackend::open(&self.options(watch_events)).expect("open the NVML backend on the fake library")
    }

    /// The NVML functions called so far.
    pub fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.trace).unwrap_or_default().lines().map(str::to_string).collect()
    }
}

/// A sysfs tree placing each GPU as the simulator does: `devices/<pcie root>/<bus id>` with its
/// `numa_node`, and the `bus/pci/devices/<bus id>` link into it that the kernel makes.
fn write_sysfs(root: &Path, gpus: &[migdra::gpu::GpuInfo]) {
    let links = root.join("bus/pci/devices");
    std::fs::create_dir_all(&links).unwrap();
    for g in gpus {
        let (Some(bdf), Some(pcie_root)) = (migdra::pci::bus_id(&g.pci_bus_id), g.topology.pcie_root.as_ref()) else {
            continue;
        };
        let device = root.join("devices").join(pcie_root).join(&bdf);
        std::fs::create_dir_all(&device).unwrap();
        let node = g.topology.numa_node.map_or(-1, i64::from);
        std::fs::write(device.join("numa_node"), format!("{node}\n")).unwrap();
        std::os::unix::fs::symlink(format!("../../../devices/{pcie_root}/{bdf}"), links.join(&bdf)).unwrap();
    }
}
