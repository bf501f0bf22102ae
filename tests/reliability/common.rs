//! What the reliability tests share: a node of simulated GPUs in a temporary directory, `migdra
//! serve` started on it as a real process, the kubelet's view through the real sockets, and the
//! figures each test prints for `hack/reliability.sh`.

use migdra::claims::ClaimRef;
use migdra::kubelet::client::TestKubelet;
use serde_json::{Value, json};
use std::cell::Cell;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const DRIVER: &str = "mig.slinky.slurm.net";
pub const NODE: &str = "node-a";
pub const NAMESPACE: &str = "team-a";

/// One line `hack/reliability.sh` turns into a row of the figures table.
pub fn figure(section: &str, name: &str, value: impl std::fmt::Display) {
    println!("FIGURE\t{section}\t{name}\t{value}");
}

/// A command with none of the caller's `MIGDRA_*`, `POD_UID`, `NODE_NAME` or `KUBECONFIG`.
pub fn migdra_cmd() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_migdra"));
    for (key, _) in std::env::vars_os() {
        if let Some(k) = key.to_str()
            && (k.starts_with("MIGDRA_") || k == "POD_UID" || k == "NODE_NAME" || k == "KUBECONFIG")
        {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A claim UID, distinct per `n`.
pub fn uid(n: u32) -> String {
    format!("0d6f6a52-3c9e-4b8e-9a0c-{n:012}")
}

/// The reference the kubelet sends for a claim [`Node::write_claim`] wrote.
pub fn claim(uid: &str) -> ClaimRef {
    ClaimRef { uid: uid.to_string(), namespace: NAMESPACE.to_string(), name: format!("claim-{uid}") }
}

/// (parent minor, profile ID, placement start, compute instances) of one GPU instance.
pub type Instance = (u64, u64, u64, usize);

/// One node: simulated GPUs and the directories a daemon and the CLI share.
pub struct Node {
    tmp: tempfile::TempDir,
    daemons: Cell<u32>,
    /// `--state-dir`; a test may mount something there before the first daemon starts.
    pub state_dir: PathBuf,
    /// `--kubeconfig` of an API server to read claims from, instead of `--claims-dir`.
    pub kubeconfig: Option<PathBuf>,
}

impl Node {
    pub fn new(spec: &str) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let state_dir = tmp.path().join("state");
        let node = Self { tmp, daemons: Cell::new(0), state_dir, kubeconfig: None };
        node.cli(&["layout", "--sim", spec]);
        node
    }

    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    pub fn plugin_dir(&self) -> PathBuf {
        self.dir().join("plugins").join(DRIVER)
    }

    pub fn registry_dir(&self) -> PathBuf {
        self.dir().join("registry")
    }

    pub fn cdi_dir(&self) -> PathBuf {
        self.dir().join("cdi")
    }

    fn node_flags(&self) -> Vec<OsString> {
        let d = self.dir();
        let mut flags: Vec<OsString> = Vec::new();
        for (flag, path) in [
            ("--sim-state", d.join("gpus.json")),
            ("--state-dir", self.state_dir.clone()),
            ("--cdi-dir", self.cdi_dir()),
            match &self.kubeconfig {
                Some(k) => ("--kubeconfig", k.clone()),
                None => ("--claims-dir", d.join("claims")),
            },
        ] {
            flags.push(flag.into());
            flags.push(path.into());
        }
        flags.extend(["--node-name".into(), NODE.into()]);
        flags
    }

    /// A `migdra` command on this node that must succeed; its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = migdra_cmd().args(args).args(self.node_flags()).output().unwrap();
        assert!(out.status.success(), "migdra {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn layout(&self) -> Value {
        serde_json::from_str(&self.cli(&["layout", "-o", "json"])).unwrap()
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
                ));
            }
        }
        out.sort_unstable();
        out
    }

    /// The claims the checkpoint holds.
    pub fn checkpoint(&self) -> Vec<Value> {
        let v: Value = serde_json::from_str(&self.cli(&["claims", "-o", "json"])).unwrap();
        v.as_array().unwrap().clone()
    }

    pub fn cdi_specs(&self) -> usize {
        std::fs::read_dir(self.cdi_dir()).map_or(0, |d| d.count())
    }

    /// A ResourceClaim as the API server returns it: `results` is its allocation.
    pub fn write_claim_object(&self, file: &str, uid: &str, name: &str, results: Value) {
        let object = json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig"}}]}},
            "status": {"allocation": {"devices": {"results": results}}}
        });
        let dir = self.dir().join("claims");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{file}.json")), object.to_string()).unwrap();
    }

    /// A claim allocated to `device` of this node and driver.
    pub fn write_claim(&self, uid: &str, device: &str) {
        let results = json!([{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]);
        self.write_claim_object(uid, uid, &format!("claim-{uid}"), results);
    }

    /// Start `migdra serve` without waiting for it.
    pub fn spawn(&self, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let n = self.daemons.get() + 1;
        self.daemons.set(n);
        let log = self.dir().join(format!("daemon-{n}.log"));
        let mut cmd = migdra_cmd();
        cmd.arg("serve")
            .args(self.node_flags())
            .arg("--plugin-dir")
            .arg(self.plugin_dir())
            .arg("--registry-dir")
            .arg(self.registry_dir())
            .args(["--health-interval", "100ms", "--socket-check", "100ms"])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        Daemon {
            child: cmd.spawn().unwrap(),
            registration: self.registry_dir().join(format!("{DRIVER}-reg.sock")),
            dra: self.plugin_dir().join("dra.sock"),
            log,
        }
    }

    /// Start `migdra serve`, wait until it answers, and register as the kubelet.
    pub async fn serve(&self, extra: &[&str], env: &[(&str, &str)]) -> (Daemon, TestKubelet) {
        let mut daemon = self.spawn(extra, env);
        daemon.wait_ready().await;
        let kubelet = daemon.register().await;
        (daemon, kubelet)
    }
}

/// A running `migdra serve`, SIGKILLed when dropped.
pub struct Daemon {
    pub child: Child,
    pub registration: PathBuf,
    pub dra: PathBuf,
    log: PathBuf,
}

impl Daemon {
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Until the registration socket accepts connections.
    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            assert!(self.running(), "migdra serve exited before it was ready:\n{}", self.log());
            if std::os::unix::net::UnixStream::connect(&self.registration).is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "no registration socket after 20 s:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn register(&self) -> TestKubelet {
        match TestKubelet::register(&self.registration).await {
            Ok(k) => k,
            Err(e) => panic!("registration failed: {e}\n{}", self.log()),
        }
    }

    /// The exit status, if the process ends within `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Memory slices `[start, start + size)` of an H100 80GB profile, by profile ID.
pub fn h100_size(profile_id: u64) -> u64 {
    match profile_id {
        19 => 1,
        15 | 14 => 2,
        9 | 5 => 4,
        0 => 8,
        other => panic!("profile {other} not used here"),
    }
}
