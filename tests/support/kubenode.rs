//! A real Kubernetes node for end-to-end tests: the kubelet binary, containerd and runc built by
//! `hack/build-node.sh`, joined to a [`ControlPlane`] started with
//! [`ControlPlane::start_for_nodes`]. Pods run in real containers; migdra runs as the chart's
//! DaemonSet pod from the image `hack/build-image.sh` writes.
//!
//! - **Private mount namespace.** A holder process (`unshare --mount --propagation private`) owns a
//!   mount namespace, its root made shared inside it as systemd makes a node's (the chart's
//!   HostToContainer mount of `/` needs that; nothing propagates back to the host), that
//!   containerd, its shims and the kubelet join (`nsenter`). In it: a fresh tmpfs on `/run`
//!   (containerd's shim sockets, CDI specs in `/var/run/cdi`, runc's and containerd's state: all
//!   lost on a [`KubeNode::reboot`], as on a real node), tmpfs on the kubelet's fixed paths
//!   (`/var/lib/kubelet`, `/var/log/containers`), and an overlay on `/dev` holding the device nodes
//!   the simulated GPUs' CDI specs name (`/dev/nvidiactl`, `/dev/nvidia-uvm`,
//!   `/dev/nvidia-uvm-tools`, `/dev/nvidia0..7`). The host's `/dev`, `/run` and `/var` stay
//!   untouched.
//! - **Its own directories** under one temporary directory: the kubelet's `--root-dir` (not the
//!   default, as on k0s or MicroK8s: the chart's `kubeletRootDir` is tested with it), containerd's
//!   root, the CNI configuration, pod logs and the simulated GPUs' state.
//! - **Networking.** Pods get addresses on a bridge ([`BRIDGE`], [`POD_SUBNET`]) through Debian's
//!   CNI plugins; there is no kube-proxy, so in-cluster clients are pointed at the API server on
//!   the bridge's address ([`POD_GATEWAY`]) through `KUBERNETES_SERVICE_HOST`/`_PORT`. The bridge
//!   is made before the kubelet starts, and its address is the node's IP too (the kubelet refuses
//!   a loopback one): `kubectl exec` and `logs` reach the kubelet there, never leaving the host.
//! - **Teardown leaves nothing:** every process in the node's cgroups and mount namespace is
//!   killed, the cgroups removed, the bridge deleted, the directories removed. Missing binaries
//!   fail the test with the command that builds them; nothing is skipped.
//! - **One node per machine at a time:** the bridge and the kubelet's cgroups are the host's, and
//!   a new node first removes what a killed one left (its processes, cgroups), so `hack/node-up.sh`
//!   and `tests/node/` do not run together.

use super::controlplane::{ControlPlane, free_port};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The pod bridge, its subnet and the host's address on it.
pub const BRIDGE: &str = "migdra-cni0";
pub const POD_SUBNET: &str = "10.254.233.0/24";
pub const POD_GATEWAY: &str = "10.254.233.1";
/// The images `hack/node-images.sh` builds: the pod sandbox and a busybox workload.
pub const PAUSE_IMAGE: &str = "migdra.test/pause:1";
pub const WORKLOAD_IMAGE: &str = "migdra.test/busybox:1";
/// Device nodes the simulated GPUs' CDI specs name by path: (name, major, minor).
pub const DEVICE_NODES: [(&str, u32, u32); 11] = [
    ("nvidiactl", 195, 255),
    ("nvidia-uvm", 510, 0),
    ("nvidia-uvm-tools", 510, 1),
    ("nvidia0", 195, 0),
    ("nvidia1", 195, 1),
    ("nvidia2", 195, 2),
    ("nvidia3", 195, 3),
    ("nvidia4", 195, 4),
    ("nvidia5", 195, 5),
    ("nvidia6", 195, 6),
    ("nvidia7", 195, 7),
];
const BINARIES: [&str; 7] = ["kubelet", "kubectl", "containerd", "containerd-shim-runc-v2", "ctr", "runc", "crictl"];
/// What the mount namespace's holder runs, so that a stale one is recognised.
const HOLDER_SLEEP: &str = "2147483646";
const HOLDER_CMDLINE: &[u8] = b"sleep\x002147483646\x00";
/// The kubelet's cgroups (cgroupfs driver, default root) in every hierarchy.
const KUBEPODS: &str = "kubepods";

/// The directory holding the node's binaries, or a panic that says how to build them.
pub fn bin_dir() -> PathBuf {
    let help = "build the node first: `bash hack/build-node.sh` (cached; it prints the bin directory as its \
                last line), then export MIGDRA_NODE_BIN=<that directory> or rerun `bash hack/test.sh`";
    let dir = match std::env::var_os("MIGDRA_NODE_BIN") {
        Some(d) => PathBuf::from(d),
        None => {
            let cache = super::controlplane::cache_dir();
            std::fs::read_dir(&cache)
                .ok()
                .and_then(|entries| {
                    entries
                        .flatten()
                        .filter(|e| e.file_name().to_string_lossy().starts_with("node-"))
                        .map(|e| e.path().join("bin"))
                        .filter(|bin| BINARIES.iter().all(|b| bin.join(b).is_file()))
                        .max_by_key(|bin| bin.metadata().and_then(|m| m.modified()).ok())
                })
                .unwrap_or_else(|| panic!("no node binaries under {}/node-*/bin: {help}", cache.display()))
        }
    };
    for b in BINARIES {
        assert!(dir.join(b).is_file(), "{} is missing: {help}", dir.join(b).display());
    }
    dir
}

/// The release of the node's kubelet (`kubelet --version`): the control plane it joins is built
/// from the same release, as on a cluster whose nodes run their control plane's version.
pub fn release() -> super::controlplane::Release {
    let kubelet = bin_dir().join("kubelet");
    let out = output(&kubelet, &["--version"]);
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string(); // "Kubernetes v1.38.0-beta.0"
    let minor = version.split('.').nth(1).and_then(|m| m.parse().ok());
    minor.and_then(super::controlplane::release).unwrap_or_else(|| {
        panic!("{}: {version:?} is no release of the test matrix (1.36, 1.37, 1.38)", kubelet.display())
    })
}

/// The image archives: migdra's (`hack/build-image.sh`, or `$MIGDRA_IMAGE_ARCHIVE`; under
/// `.ci/run` built in the background, `MIGDRA_IMAGE_BUILD_LOG` naming its log, so this waits for
/// it), then the pause and workload images (`hack/node-images.sh`, built into `dir`).
pub fn image_archives(dir: &Path) -> Vec<PathBuf> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Some(log) = std::env::var_os("MIGDRA_IMAGE_BUILD_LOG") {
        super::background::wait_for(Path::new(&log), "migdra's amd64 image", "hack/build-image.sh amd64");
    }
    let migdra = std::env::var_os("MIGDRA_IMAGE_ARCHIVE").map_or_else(
        || {
            let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo.join("target"), PathBuf::from);
            target.join(format!("image/migdra-{}.oci.tar", env!("CARGO_PKG_VERSION")))
        },
        PathBuf::from,
    );
    assert!(
        migdra.is_file(),
        "{}: no migdra image; build it with `bash hack/build-image.sh` (or set MIGDRA_IMAGE_ARCHIVE)",
        migdra.display()
    );
    let out =
        Command::new("bash").arg(repo.join("hack/node-images.sh")).arg(dir).output().expect("run hack/node-images.sh");
    assert!(out.status.success(), "hack/node-images.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut archives = vec![migdra];
    archives.extend(String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from));
    archives
}

/// Run a command to completion; its output, or a panic naming it with its stderr.
pub use super::render::run;

/// Run a command to completion, whatever its exit.
pub fn output(program: &Path, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("start {}: {e}", program.display()))
}

/// A running node; torn down on drop.
pub struct KubeNode {
    dir: Option<tempfile::TempDir>,
    pub name: String,
    pub bin: PathBuf,
    kubeconfig: PathBuf,
    holder: Option<Child>,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    kubelet_port: u16,
    healthz_port: u16,
    /// Paths this node created outside its directory (removed on drop when still empty).
    created: Vec<PathBuf>,
    /// How long [`KubeNode::start`] took, to the kubelet's first healthy answer.
    pub startup: Duration,
}

impl KubeNode {
    /// Start containerd and a kubelet named `name` against `cp`, import `images` (OCI archives),
    /// and wait for the kubelet's health endpoint. The Node object registers itself; wait for it
    /// to be Ready with the API.
    pub fn start(cp: &ControlPlane, name: &str, images: &[PathBuf]) -> Self {
        super::logs::remember_panics();
        let t0 = Instant::now();
        let bin = bin_dir();
        // A test killed before its teardown (SIGKILL, a timeout) leaves its node running.
        clean_stale(&bin);
        let dir = tempfile::Builder::new().prefix("migdra-node-").tempdir().unwrap();
        let mut node = Self {
            dir: Some(dir),
            name: name.into(),
            bin,
            kubeconfig: cp.kubeconfig().to_path_buf(),
            holder: None,
            containerd: None,
            kubelet: None,
            kubelet_port: free_port(),
            healthz_port: free_port(),
            created: Vec::new(),
            startup: Duration::ZERO,
        };
        node.write_config();
        node.boot();
        for archive in images {
            let a = archive.display().to_string();
            node.ctr(&["images", "import", "--no-unpack", &a]);
        }
        node.start_kubelet();
        node.startup = t0.elapsed();
        node
    }

    /// The node's directory; `kubelet/` in it is the kubelet's `--root-dir`.
    pub fn dir(&self) -> PathBuf {
        self.dir.as_ref().expect("the node directory").path().to_path_buf()
    }

    /// The kubelet's `--root-dir`, for the chart's `kubeletRootDir`.
    pub fn root_dir(&self) -> PathBuf {
        self.dir().join("kubelet")
    }

    /// The host directory of the simulated GPUs, for the chart's `simulation.stateDir`.
    pub fn sim_dir(&self) -> PathBuf {
        self.dir().join("sim")
    }

    /// The simulated hardware's state file, as the chart names it.
    pub fn sim_state(&self) -> PathBuf {
        self.sim_dir().join("gpus.json")
    }

    fn socket(&self) -> String {
        format!("{}/containerd.sock", self.dir().join("containerd").display())
    }

    fn write_config(&mut self) {
        let d = self.dir();
        for sub in [
            "containerd",
            "kubelet",
            "kubelet-pki",
            "pod-logs",
            "manifests",
            "cni",
            "cni-ipam",
            "dev-upper",
            "dev-work",
            "sim",
        ] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        // The fixed paths the kubelet writes; created empty if missing, tmpfs over them inside.
        for fixed in ["/var/lib/kubelet", "/var/log/containers"] {
            let p = PathBuf::from(fixed);
            if !p.exists() {
                std::fs::create_dir_all(&p).unwrap();
                self.created.push(p);
            }
        }
        let bin = self.bin.display().to_string();
        std::fs::write(
            d.join("containerd/config.toml"),
            format!(
                r#"version = 3
root = "{root}"
state = "/run/migdra-node/containerd"
[grpc]
  address = "{sock}"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE here: the sandbox's oom_score_adj of -998 would be refused.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{bin}/runc"
        Root = "/run/migdra-node/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "{cni}"
"#,
                root = d.join("containerd/root").display(),
                sock = self.socket(),
                cni = d.join("cni").display(),
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("cni/10-migdra-test.conflist"),
            format!(
                r#"{{"cniVersion": "1.0.0", "name": "migdra-test", "plugins": [
  {{"type": "bridge", "bridge": "{BRIDGE}", "isGateway": true, "ipMasq": false,
    "ipam": {{"type": "host-local", "subnet": "{POD_SUBNET}", "gateway": "{POD_GATEWAY}",
             "dataDir": "{ipam}", "routes": [{{"dst": "0.0.0.0/0"}}]}}}}
]}}
"#,
                ipam = d.join("cni-ipam").display()
            ),
        )
        .unwrap();
        std::fs::write(
            d.join("kubelet-config.yaml"),
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                 # cgroup v1 hybrid here; 1.37 refuses it unless told.\nfailCgroupV1: false\n\
                 cgroupDriver: cgroupfs\nfailSwapOn: false\n\
                 containerRuntimeEndpoint: unix://{sock}\nstaticPodPath: {manifests}\npodLogsDir: {logs}\n\
                 address: {POD_GATEWAY}\nport: {port}\nhealthzBindAddress: 127.0.0.1\nhealthzPort: {healthz}\n\
                 readOnlyPort: 0\nauthentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\n\
                 authorization:\n  mode: AlwaysAllow\nevictionHard:\n  memory.available: 100Mi\n\
                 imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n\
                 # Pods see the node's status sooner than the default 10 s.\nnodeStatusUpdateFrequency: 2s\n\
                 syncFrequency: 5s\nfileCheckFrequency: 5s\n",
                sock = self.socket(),
                manifests = d.join("manifests").display(),
                logs = d.join("pod-logs").display(),
                port = self.kubelet_port,
                healthz = self.healthz_port,
            ),
        )
        .unwrap();
    }

    /// The pod bridge with the host's address on it (the CNI bridge plugin takes it as it finds it).
    fn bridge() {
        if Path::new("/sys/class/net").join(BRIDGE).exists() {
            return;
        }
        let address = format!("{POD_GATEWAY}/24");
        for args in [
            ["link", "add", BRIDGE, "type", "bridge"].as_slice(),
            ["addr", "add", &address, "dev", BRIDGE].as_slice(),
            ["link", "set", BRIDGE, "up"].as_slice(),
        ] {
            run(Path::new("ip"), args);
        }
    }

    /// The holder of the mount namespace, with its mounts and device nodes, then containerd.
    fn boot(&mut self) {
        Self::bridge();
        let d = self.dir();
        let ready = d.join("holder-ready");
        let _ = std::fs::remove_file(&ready);
        let mut script = format!(
            "set -e\n\
             mount --make-rshared /\n\
             mount -t tmpfs -o mode=0755 tmpfs /run\n\
             mkdir -p /run/migdra-node /run/cdi\n\
             mount -t tmpfs tmpfs /var/lib/kubelet\n\
             mount -t tmpfs tmpfs /var/log/containers\n\
             rm -rf {upper}/* {work}/*\n\
             mount -t overlay overlay -o lowerdir=/dev,upperdir={upper},workdir={work} /dev\n\
             mkdir -p /dev/pts /dev/shm /dev/mqueue\n\
             mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts\n\
             ln -sf pts/ptmx /dev/ptmx\n\
             mount -t tmpfs -o mode=1777 shm /dev/shm\n\
             mount -t mqueue mqueue /dev/mqueue || true\n",
            upper = d.join("dev-upper").display(),
            work = d.join("dev-work").display(),
        );
        for (name, major, minor) in DEVICE_NODES {
            script.push_str(&format!("rm -f /dev/{name}; mknod -m 0666 /dev/{name} c {major} {minor}\n"));
        }
        script.push_str(&format!("touch {}\nexec sleep {HOLDER_SLEEP}\n", ready.display()));
        let log = std::fs::File::create(d.join("holder.log")).unwrap();
        let holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--fork", "--", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start unshare (util-linux)");
        self.holder = Some(holder);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            if let Some(status) = self.holder.as_mut().and_then(|h| h.try_wait().ok().flatten()) {
                panic!("the node's mount namespace failed ({status}): {}", self.log("holder"));
            }
            assert!(Instant::now() < deadline, "the node's mount namespace: not ready in 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        self.start_containerd();
    }

    /// The PID of the process holding the node's mount namespace (`sleep` under `unshare`).
    pub fn holder_pid(&self) -> u32 {
        let unshare = self.holder.as_ref().expect("the node is booted").id();
        // unshare --fork: the namespace's first process is its child.
        let children = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).unwrap_or_default();
        children.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(unshare)
    }

    /// A command run inside the node's mount namespace.
    pub fn in_node(&self, program: &Path) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg("--mount").arg(format!("--target={}", self.holder_pid())).arg("--").arg(program);
        cmd.stdin(Stdio::null());
        cmd
    }

    fn spawn_logged(&self, what: &str, program: &Path, args: &[String]) -> Child {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir().join(format!("{what}.log"))).unwrap();
        let mut cmd = self.in_node(program);
        cmd.args(args).stdout(log.try_clone().unwrap()).stderr(log);
        // The shim and runc are found on PATH.
        let path = format!("{}:{}", self.bin.display(), std::env::var("PATH").unwrap_or_default());
        cmd.env("PATH", path);
        cmd.spawn().unwrap_or_else(|e| panic!("start {what}: {e}"))
    }

    /// Start containerd and wait for its socket to answer.
    pub fn start_containerd(&mut self) {
        let config = self.dir().join("containerd/config.toml").display().to_string();
        let child = self.spawn_logged("containerd", &self.bin.join("containerd"), &["--config".into(), config]);
        self.containerd = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.containerd.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("containerd exited ({status}):\n{}", self.log("containerd"));
            }
            let sock = self.socket();
            if output(&self.bin.join("ctr"), &["--address", &sock, "version"]).status.success() {
                return;
            }
            assert!(Instant::now() < deadline, "containerd did not answer in 30 s:\n{}", self.log("containerd"));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `ctr -n k8s.io ARGS…` against this node's containerd.
    pub fn ctr(&self, args: &[&str]) -> String {
        let sock = self.socket();
        let mut all = vec!["--address", sock.as_str(), "-n", "k8s.io"];
        all.extend_from_slice(args);
        // In the node's mount namespace: an import unpacks nothing, but tags and mounts may.
        let out = self.in_node(&self.bin.join("ctr")).args(&all).output().expect("run ctr");
        assert!(out.status.success(), "ctr {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `crictl ARGS…` against this node's containerd, whatever its exit.
    pub fn crictl(&self, args: &[&str]) -> Output {
        let endpoint = format!("unix://{}", self.socket());
        let mut all = vec!["--runtime-endpoint", endpoint.as_str(), "--image-endpoint", endpoint.as_str()];
        all.extend_from_slice(args);
        self.in_node(&self.bin.join("crictl")).args(&all).output().expect("run crictl")
    }

    /// Start the kubelet and wait for its health endpoint.
    pub fn start_kubelet(&mut self) {
        let d = self.dir();
        let args = vec![
            format!("--config={}", d.join("kubelet-config.yaml").display()),
            format!("--root-dir={}", self.root_dir().display()),
            format!("--cert-dir={}", d.join("kubelet-pki").display()),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={POD_GATEWAY}"),
            "--v=2".into(),
        ];
        let child = self.spawn_logged("kubelet", &self.bin.join("kubelet"), &args);
        self.kubelet = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.kubelet.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("the kubelet exited ({status}):\n{}", self.log("kubelet"));
            }
            if healthz(self.healthz_port) {
                return;
            }
            assert!(Instant::now() < deadline, "the kubelet not healthy in 60 s:\n{}", self.log("kubelet"));
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kill the kubelet (SIGKILL, as a crash); containerd and the containers go on.
    pub fn stop_kubelet(&mut self) {
        stop(self.kubelet.take());
    }

    /// Kill the kubelet (SIGKILL, as a crash) and start it again.
    pub fn restart_kubelet(&mut self) {
        self.stop_kubelet();
        self.start_kubelet();
    }

    /// Kill containerd (SIGKILL; its shims and containers go on, as on a real node) and start it.
    pub fn restart_containerd(&mut self) {
        stop(self.containerd.take());
        self.start_containerd();
    }

    /// A node reboot: every process of the node killed (kubelet, containerd, shims, every
    /// container), its cgroups removed, its mount namespace gone with `/run` (CDI specs,
    /// containerd's and runc's state) and the device nodes; `before_boot` runs while the node is
    /// down (the test reboots the simulated GPUs there); then the node boots again from its disk:
    /// the kubelet's root dir, containerd's images, the simulator's state file.
    pub fn reboot(&mut self, before_boot: impl FnOnce()) {
        self.power_off();
        before_boot();
        self.boot();
        self.start_kubelet();
    }

    fn power_off(&mut self) {
        stop(self.kubelet.take());
        kill_cgroup_tree();
        let ns = self.holder.as_ref().map(|_| mount_ns(self.holder_pid()));
        stop(self.containerd.take());
        if let Some(ns) = ns {
            // Shims and anything else still in the namespace.
            for pid in pids_in_mount_ns(&ns) {
                let _ = kill9(pid);
            }
        }
        stop(self.holder.take());
        kill_cgroup_tree();
        remove_cgroups();
    }

    /// The last lines of one of the node's logs: `containerd`, `kubelet` or `holder`.
    pub fn log(&self, what: &str) -> String {
        super::logs::file_tail(what, &self.dir().join(format!("{what}.log")), 40)
    }

    /// What is left on the host of this node after teardown, for the test to assert empty.
    pub fn leftovers(&self) -> Vec<String> {
        leftovers()
    }
}

/// What a torn-down node may leave on the host and must not: the kubelet's cgroups, the bridge.
pub fn leftovers() -> Vec<String> {
    let mut left: Vec<String> = cgroup_dirs().into_iter().map(|p| p.display().to_string()).collect();
    if Path::new("/sys/class/net").join(BRIDGE).exists() {
        left.push(format!("network interface {BRIDGE}"));
    }
    left
}

impl Drop for KubeNode {
    #[allow(clippy::print_stderr)] // what a failing test leaves behind
    fn drop(&mut self) {
        if std::thread::panicking() {
            for what in ["kubelet", "containerd"] {
                eprintln!("{}", self.log(what));
            }
            // The daemon's own account: each migdra container's log, every pod and restart.
            let pods = std::fs::read_dir(self.dir().join("pod-logs")).into_iter().flatten().flatten();
            for file in
                pods.flat_map(|pod| std::fs::read_dir(pod.path().join("migdra")).into_iter().flatten().flatten())
            {
                let name = file.path().strip_prefix(self.dir()).unwrap_or(&file.path()).display().to_string();
                eprintln!("{}", super::logs::file_tail(&name, &file.path(), 25));
            }
            super::logs::repeat_failure();
        }
        self.power_off();
        let _ = Command::new("ip").args(["link", "delete", BRIDGE]).output();
        for p in self.created.iter().rev() {
            let _ = std::fs::remove_dir(p);
        }
        if std::thread::panicking() && std::env::var_os("MIGDRA_KEEP_NODE").is_some() {
            if let Some(dir) = self.dir.take() {
                eprintln!("node directory kept: {}", dir.keep().display());
            }
        } else if let Some(dir) = self.dir.take() {
            // Overlay snapshots hold read-only directories; a failed removal is reported, not fatal.
            if let Err(e) = std::fs::remove_dir_all(dir.path()) {
                eprintln!("removing {}: {e}", dir.path().display());
            }
        }
    }
}

fn stop(child: Option<Child>) {
    if let Some(mut c) = child {
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn healthz(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.starts_with("HTTP/1.") && body.contains(" 200 ") && body.ends_with("ok")
}

/// The identity of a process's mount namespace.
fn mount_ns(pid: u32) -> u64 {
    std::fs::metadata(format!("/proc/{pid}/ns/mnt")).map(|m| m.ino()).unwrap_or(0)
}

fn pids_in_mount_ns(ns: &u64) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me && mount_ns(pid) == *ns)
        .collect()
}

/// SIGKILL, through kill(1): the tests' crates have no signal API of their own.
fn kill9(pid: u32) -> std::io::Result<()> {
    let status = Command::new("kill").args(["-KILL", &pid.to_string()]).stderr(Stdio::null()).status()?;
    if status.success() { Ok(()) } else { Err(std::io::Error::other("kill failed")) }
}

/// Every cgroup directory the kubelet made, deepest first, in every hierarchy.
fn cgroup_dirs() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), out);
            }
        }
        out.push(dir.to_path_buf());
    }
    let mut out = Vec::new();
    for h in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        let root = h.path().join(KUBEPODS);
        if root.is_dir() {
            walk(&root, &mut out);
        }
    }
    out
}

/// Kill what a node of an earlier run left (processes of the node's binaries, containers in the
/// kubelet's cgroups) and remove its cgroups, saying so.
#[allow(clippy::print_stdout)] // the test says what it cleaned up
fn clean_stale(bin: &Path) {
    let stale: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe.starts_with(bin))
                || std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == HOLDER_CMDLINE)
        })
        .collect();
    let cgroups = cgroup_dirs();
    if stale.is_empty() && cgroups.is_empty() {
        return;
    }
    println!("a node of an earlier run was left: killing {stale:?}, removing {} cgroups", cgroups.len());
    for pid in stale {
        let _ = kill9(pid);
    }
    kill_cgroup_tree();
    remove_cgroups();
}

/// SIGKILL every process in the kubelet's cgroups (the containers and their sandboxes), until
/// none is left.
fn kill_cgroup_tree() {
    for _ in 0..50 {
        let pids: Vec<u32> = cgroup_dirs()
            .iter()
            .flat_map(|d| {
                std::fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = kill9(pid);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Remove the kubelet's cgroups, deepest first.
fn remove_cgroups() {
    for _ in 0..20 {
        let dirs = cgroup_dirs();
        if dirs.is_empty() {
            return;
        }
        for d in dirs {
            let _ = std::fs::remove_dir(&d);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
