//! One node's directories in a temporary directory, laid out the same way for every test, and
//! the `migdra` CLI pointed at them:
//!
//! ```text
//! <tmp>/gpus.json          the simulator's state file: the hardware (unless the GPUs are elsewhere)
//!       state/             --state-dir: the checkpoint
//!       cdi/               --cdi-dir: the CDI specs
//!       claims/            --claims-dir: ResourceClaims as files (unless read from an API server)
//!       plugins/<driver>/  --plugin-dir (every command): the DRA socket, the device metadata
//!       registry/          --registry-dir: the registration socket
//!       daemon-<n>.log     the n-th daemon's stderr
//! ```

use super::claim::Claim;
use super::command::{Run, migdra};
use super::daemon::Serve;
use super::{DRIVER, NODE};
use serde_json::Value;
use std::cell::Cell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the node's GPUs come from.
#[derive(Debug, Clone)]
pub enum Gpus {
    /// The simulator, its state in `gpus.json` (`--sim-state`), shared by every process.
    StateFile,
    /// The simulator in the daemon's memory (`--sim`): no NVML latency, no file.
    InMemory(String),
    /// The NVML backend on this library and procfs tree (the fake libnvidia-ml).
    Nvml { lib: PathBuf, procfs: PathBuf, sysfs: PathBuf },
}

/// One node's directories; removed when dropped.
pub struct NodeDir {
    tmp: tempfile::TempDir,
    name: String,
    gpus: Gpus,
    /// Claims from the API server of this kubeconfig instead of `claims/`.
    kubeconfig: Option<PathBuf>,
    /// `--host-root`: where prepare looks for the device nodes; migdra's default when `None`.
    host_root: Option<OsString>,
    state_dir: bool,
    daemons: Cell<u32>,
}

impl Default for NodeDir {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeDir {
    /// A node named [`NODE`] in a new temporary directory; no GPUs yet (see [`NodeDir::simulate`]).
    pub fn new() -> Self {
        Self::from_tempdir(tempfile::tempdir().expect("a temporary directory"))
    }

    /// The same under `base` (a real disk, or tmpfs).
    pub fn under(base: &Path) -> Self {
        let tmp = tempfile::Builder::new().prefix("migdra-node-").tempdir_in(base);
        Self::from_tempdir(tmp.unwrap_or_else(|e| panic!("a temporary directory under {}: {e}", base.display())))
    }

    fn from_tempdir(tmp: tempfile::TempDir) -> Self {
        Self {
            tmp,
            name: NODE.into(),
            gpus: Gpus::StateFile,
            kubeconfig: None,
            host_root: None,
            state_dir: true,
            daemons: Cell::new(0),
        }
    }

    /// Node (and pool) name `name` instead of [`NODE`].
    pub fn named(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }

    /// Simulated GPUs (`--sim` syntax) in the state file, made now.
    pub fn simulate(self, spec: &str) -> Self {
        self.cli(&["layout", "--sim", spec]);
        self
    }

    /// Simulated GPUs in each process's memory: for the daemon alone, as nothing else sees them.
    pub fn in_memory(mut self, spec: &str) -> Self {
        self.gpus = Gpus::InMemory(spec.into());
        self
    }

    /// GPUs through NVML, from this library, procfs tree and sysfs tree.
    pub fn nvml(mut self, lib: PathBuf, procfs: PathBuf, sysfs: PathBuf) -> Self {
        self.gpus = Gpus::Nvml { lib, procfs, sysfs };
        self
    }

    /// Claims from the API server of this kubeconfig, instead of `claims/`.
    pub fn kubeconfig(mut self, kubeconfig: PathBuf) -> Self {
        self.kubeconfig = Some(kubeconfig);
        self
    }

    /// `--host-root ROOT` (a directory, or `none`) for every command on this node.
    pub fn host_root(mut self, root: impl Into<OsString>) -> Self {
        self.host_root = Some(root.into());
        self
    }

    /// No `--state-dir`: the daemon keeps its checkpoint in the plugin directory.
    pub fn without_state_dir(mut self) -> Self {
        self.state_dir = false;
        self
    }

    pub fn path(&self) -> &Path {
        self.tmp.path()
    }

    pub fn node_name(&self) -> &str {
        &self.name
    }

    pub fn sim_state(&self) -> PathBuf {
        self.path().join("gpus.json")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path().join("state")
    }

    pub fn cdi_dir(&self) -> PathBuf {
        self.path().join("cdi")
    }

    pub fn claims_dir(&self) -> PathBuf {
        self.path().join("claims")
    }

    pub fn plugin_dir(&self) -> PathBuf {
        self.path().join("plugins").join(DRIVER)
    }

    pub fn registry_dir(&self) -> PathBuf {
        self.path().join("registry")
    }

    /// The log file of the next daemon started here.
    pub(super) fn next_log(&self) -> PathBuf {
        self.daemons.set(self.daemons.get() + 1);
        self.log_of(self.daemons.get())
    }

    /// The log file of the `n`-th daemon (from 1).
    pub fn log_of(&self, n: u32) -> PathBuf {
        self.path().join(format!("daemon-{n}.log"))
    }

    /// How many daemons were started here.
    pub fn daemons(&self) -> u32 {
        self.daemons.get()
    }

    /// The flags that point `migdra` at this node: its GPUs, directories, claims and name.
    pub fn flags(&self) -> Vec<OsString> {
        let mut flags: Vec<OsString> = Vec::new();
        let mut flag = |name: &str, value: OsString| {
            flags.push(name.into());
            flags.push(value);
        };
        match &self.gpus {
            Gpus::StateFile => flag("--sim-state", self.sim_state().into()),
            Gpus::InMemory(spec) => flag("--sim", spec.into()),
            Gpus::Nvml { lib, procfs, sysfs } => {
                flag("--nvml-lib", lib.into());
                flag("--procfs-root", procfs.into());
                flag("--sysfs-root", sysfs.into());
            }
        }
        // Every command sees the daemon's plugin directory: the device metadata lives there.
        flag("--plugin-dir", self.plugin_dir().into());
        if self.state_dir {
            flag("--state-dir", self.state_dir().into());
        }
        flag("--cdi-dir", self.cdi_dir().into());
        match &self.kubeconfig {
            Some(k) => flag("--kubeconfig", k.into()),
            None => flag("--claims-dir", self.claims_dir().into()),
        }
        flag("--node-name", self.name.clone().into());
        if let Some(root) = &self.host_root {
            flag("--host-root", root.clone());
        }
        flags
    }

    /// `migdra <args>` on this node, not yet run.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = migdra();
        cmd.args(args).args(self.flags());
        self.without_host_slurm(&mut cmd);
        cmd
    }

    /// Keeps the host's Slurm out: migdra's defaults read `/etc/slurm/slurm.conf` and ask the
    /// `slurmd` on PATH, and CI installs Slurm. A test of Slurm gives its own `--slurm-conf` and
    /// `--slurmd`, which win over these variables.
    pub fn without_host_slurm(&self, cmd: &mut Command) {
        cmd.env("MIGDRA_SLURM_CONF", self.path().join("no-slurm.conf")).env("MIGDRA_SLURMD", "none");
    }

    /// `migdra <args>` on this node, which must succeed; its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        self.command(args).ok()
    }

    /// `migdra layout -o json`: the hardware.
    pub fn layout(&self) -> Value {
        self.command(&["layout", "-o", "json"]).json()
    }

    /// Device minors by NVML index.
    pub fn minors(&self) -> Vec<u64> {
        self.layout()["gpus"].as_array().unwrap().iter().map(|g| g["minor"].as_u64().unwrap()).collect()
    }

    pub fn boot_id(&self) -> String {
        self.layout()["boot_id"].as_str().unwrap().to_string()
    }

    /// Every GPU instance on the node, sorted.
    pub fn instances(&self) -> Vec<Instance> {
        let mut out = Vec::new();
        for g in self.layout()["gpus"].as_array().unwrap() {
            for i in g["instances"].as_array().unwrap() {
                out.push((
                    g["minor"].as_u64().unwrap(),
                    i["profile_id"].as_u64().unwrap(),
                    i["placement"]["start"].as_u64().unwrap(),
                    i["compute_instances"].as_array().unwrap().len(),
                    i["gpu_instance_id"].as_u64().unwrap(),
                ));
            }
        }
        out.sort_unstable();
        out
    }

    /// What a test can predict of every instance: (minor, profile ID, start, compute instances).
    pub fn placements(&self) -> Vec<Placement> {
        self.instances().into_iter().map(|(m, p, s, c, _)| (m, p, s, c)).collect()
    }

    /// The claims the checkpoint holds (`migdra claims -o json`).
    pub fn checkpoint(&self) -> Vec<Value> {
        let v = self.command(&["claims", "-o", "json"]).json();
        v.as_array().expect("a JSON array of claims").clone()
    }

    /// How many CDI specs are on disk.
    pub fn cdi_specs(&self) -> usize {
        std::fs::read_dir(self.cdi_dir()).map_or(0, |d| d.count())
    }

    /// Every device metadata file under the plugin directory (paths name namespace and claim).
    pub fn metadata_files(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() { walk(&path, out) } else { out.push(path) }
            }
        }
        let mut out = Vec::new();
        walk(&self.plugin_dir().join(migdra::cdi::metadata::SUBDIR), &mut out);
        out
    }

    /// Writes claim `uid`, allocated `device` of this node; the claim.
    pub fn write_claim(&self, uid: &str, device: &str) -> Claim {
        let claim = Claim::new(uid).device(&self.name, device);
        self.write(&claim);
        claim
    }

    /// Writes `claim` to `claims/<uid>.json`.
    pub fn write(&self, claim: &Claim) {
        self.write_as(&claim.uid, claim);
    }

    /// Writes `claim` to `claims/<file>.json` (a UID that is no file name).
    pub fn write_as(&self, file: &str, claim: &Claim) {
        let dir = self.claims_dir();
        std::fs::create_dir_all(&dir).expect("the claims directory");
        std::fs::write(dir.join(format!("{file}.json")), claim.object().to_string()).expect("a claim file");
    }

    /// `migdra serve` on this node, to configure and start.
    pub fn serve(&self) -> Serve<'_> {
        Serve::new(self)
    }

    /// `migdra probe` as the DaemonSet runs it against a [`Self::serve`] of this node: its
    /// directories, and `POD_UID` when the daemon was given one.
    pub fn probe(&self, pod_uid: Option<&str>) -> Command {
        let mut cmd = self.command(&["probe"]);
        cmd.arg("--registry-dir").arg(self.registry_dir());
        if let Some(uid) = pod_uid {
            cmd.env("POD_UID", uid);
        }
        cmd
    }
}

/// Character devices where a CDI spec names host nodes by path, under `root` (for
/// `--host-root`): `dev/nvidiactl`, `dev/nvidia-uvm`, `dev/nvidia-uvm-tools` and
/// `dev/nvidia<minor>` of each minor, with /dev/null's numbers. `false` when mknod is refused
/// (not root), leaving whatever it made.
pub fn make_device_nodes(root: &Path, minors: &[u64]) -> bool {
    let dev = root.join("dev");
    std::fs::create_dir_all(&dev).unwrap_or_else(|e| panic!("{}: {e}", dev.display()));
    let names = ["nvidiactl".to_string(), "nvidia-uvm".into(), "nvidia-uvm-tools".into()];
    names.into_iter().chain(minors.iter().map(|m| format!("nvidia{m}"))).all(|name| {
        let path = dev.join(name);
        path.exists()
            || Command::new("mknod").arg(&path).args(["c", "1", "3"]).output().is_ok_and(|o| o.status.success())
    })
}

/// (parent minor, profile ID, placement start, compute instances, GI ID) of one GPU instance.
pub type Instance = (u64, u64, u64, usize, u64);

/// (parent minor, profile ID, placement start, compute instances) of one GPU instance.
pub type Placement = (u64, u64, u64, usize);
