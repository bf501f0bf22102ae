//! The real kubelet's code as a test client: `migdra-kubelet` (hack/kubelet-1.36/main.go) runs the
//! kubelet's plugin manager, DRA manager and the CDI library in one process, and answers one
//! JSON line per command line (see the program's header for the protocol).
//!
//! - The binary comes from `$MIGDRA_KUBELET_136_BIN` (`$MIGDRA_KUBELET_137_BIN`,
//!   `$MIGDRA_KUBELET_138_BIN` for the 1.37 and 1.38 builds), a directory holding
//!   `migdra-kubelet`; without it, `hack/build-kubelet.sh` is run, which answers at once from its
//!   cache when the sources have not changed. A missing binary or a failed build fails the test
//!   with the command to run; nothing is skipped.
//! - Its stderr (klog) goes to a log file beside its directories, printed in every failure.

use super::controlplane::{K136, K137, K138, Release};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, SystemTime};

/// A build of the harness: the module dir it is built from and the variable that may name it.
#[derive(Debug, Clone, Copy)]
pub struct Build {
    pub env: &'static str,
    pub module: &'static str,
    /// The control plane it runs against: its own release, as on a cluster whose nodes run the
    /// version of their control plane.
    pub controlplane: Release,
}

/// The kubelet code of Kubernetes 1.38.0-beta.0 (hack/kubelet-1.38).
pub const KUBELET_138: Build = Build { env: "MIGDRA_KUBELET_138_BIN", module: "hack/kubelet-1.38", controlplane: K138 };
/// The kubelet code of Kubernetes 1.37 (hack/kubelet-1.37).
pub const KUBELET_137: Build = Build { env: "MIGDRA_KUBELET_137_BIN", module: "hack/kubelet-1.37", controlplane: K137 };
/// The same program on the kubelet code of 1.36 (hack/kubelet-1.36).
pub const KUBELET_136: Build = Build { env: "MIGDRA_KUBELET_136_BIN", module: "hack/kubelet-1.36", controlplane: K136 };

/// `migdra-kubelet` of this build, or a panic that says how to get it.
pub fn binary(build: Build) -> PathBuf {
    let help = format!(
        "build it first: `bash hack/build-kubelet.sh {}` (cached; it prints the bin directory as its last line), \
         then export {}=<that directory> or run `bash hack/test.sh`, which does both",
        build.module, build.env
    );
    let dir = match std::env::var_os(build.env) {
        Some(d) => PathBuf::from(d),
        None => {
            let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let out = Command::new("bash")
                .arg(repo.join("hack/build-kubelet.sh"))
                .arg(repo.join(build.module))
                .stderr(Stdio::inherit())
                .output()
                .unwrap_or_else(|e| {
                    panic!("{} is not set and hack/build-kubelet.sh did not run ({e}): {help}", build.env)
                });
            assert!(out.status.success(), "{} is not set and hack/build-kubelet.sh failed: {help}", build.env);
            let stdout = String::from_utf8_lossy(&out.stdout);
            PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
        }
    };
    let bin = dir.join("migdra-kubelet");
    assert!(bin.is_file(), "{} is missing ({} = {}): {help}", bin.display(), build.env, dir.display());
    let kubernetes = built_against(&bin);
    assert!(
        kubernetes.starts_with(&format!("v1.{}.", build.controlplane.minor)),
        "{} ({}) is built against k8s.io/kubernetes {kubernetes}, not 1.{}: {help}",
        bin.display(),
        build.env,
        build.controlplane.minor
    );
    bin
}

/// The `k8s.io/kubernetes` version a Go binary was built against, from the module list the go
/// command embeds (`go version -m` prints it): so a variable naming another release's build fails.
fn built_against(bin: &Path) -> String {
    let bytes = std::fs::read(bin).unwrap_or_else(|e| panic!("read {}: {e}", bin.display()));
    let key = b"dep\tk8s.io/kubernetes\t";
    let at = bytes.windows(key.len()).position(|w| w == key).map(|i| i + key.len());
    let version = at.map(|i| bytes[i..].iter().take_while(|b| !b.is_ascii_whitespace()).copied().collect::<Vec<u8>>());
    String::from_utf8_lossy(&version.unwrap_or_default()).into_owned()
}

/// Where one kubelet keeps its things.
#[derive(Debug, Clone)]
pub struct Dirs {
    pub registry: PathBuf,
    pub state: PathBuf,
    pub cdi: PathBuf,
}

/// A running harness; killed (as a crashed kubelet) on drop.
pub struct KubeletCode {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    pub log: PathBuf,
    /// When it was started, by the test's clock.
    pub spawned: SystemTime,
    pub bin: PathBuf,
}

impl KubeletCode {
    /// Start the harness for `node` with these directories. `gpu_minors` get stub device nodes
    /// in the harness' own mount namespace, so the CDI library can stat what a GPU node has.
    pub fn spawn(bin: &Path, kubeconfig: &Path, node: &str, dirs: &Dirs, gpu_minors: &[u32], log: PathBuf) -> Self {
        let minors: Vec<String> = gpu_minors.iter().map(u32::to_string).collect();
        let stderr = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let spawned = SystemTime::now();
        let mut child = Command::new(bin)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--node-name={node}"))
            .arg(format!("--registry-dir={}", dirs.registry.display()))
            .arg(format!("--state-dir={}", dirs.state.display()))
            .arg(format!("--cdi-dir={}", dirs.cdi.display()))
            .arg(format!("--stub-nvidia-minors={}", minors.join(",")))
            .arg("--v=4")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        // Blocking reads on their own thread; the test awaits lines with a timeout.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self { child, stdin, lines, log, spawned, bin: bin.to_path_buf() }
    }

    /// Send one command and wait for its answer (`timeout` past the command's own).
    pub async fn call(&mut self, cmd: Value, timeout: Duration) -> Value {
        let line = serde_json::to_string(&cmd).unwrap();
        writeln!(self.stdin, "{line}")
            .unwrap_or_else(|e| panic!("write to migdra-kubelet: {e}\n{}", self.log_tail(40)));
        self.stdin.flush().unwrap();
        match tokio::time::timeout(timeout, self.lines.recv()).await {
            Ok(Some(answer)) => serde_json::from_str(&answer)
                .unwrap_or_else(|e| panic!("migdra-kubelet answered {answer:?} to {line}: {e}")),
            Ok(None) => panic!(
                "migdra-kubelet exited ({:?}) without answering {line}\n{}",
                self.child.try_wait(),
                self.log_tail(60)
            ),
            Err(_) => panic!("migdra-kubelet did not answer {line} within {timeout:?}\n{}", self.log_tail(60)),
        }
    }

    /// Wait until the plugin manager has registered `driver` (an endpoint containing
    /// `endpoint_contains`), among the events from index `after` on. The answer, `ok` or not.
    pub async fn wait_registered(
        &mut self,
        driver: &str,
        timeout: Duration,
        after: usize,
        endpoint_contains: &str,
    ) -> Value {
        let cmd = json!({"cmd": "wait-registered", "driver": driver, "timeout_ms": timeout.as_millis() as u64,
                         "after": after, "endpoint_contains": endpoint_contains});
        self.call(cmd, timeout + Duration::from_secs(10)).await
    }

    pub async fn prepare(&mut self, namespace: &str, pod: &str) -> Value {
        self.call(json!({"cmd": "prepare", "namespace": namespace, "pod": pod}), Duration::from_secs(60)).await
    }

    pub async fn unprepare(&mut self, namespace: &str, pod: &str) -> Value {
        self.call(json!({"cmd": "unprepare", "namespace": namespace, "pod": pod}), Duration::from_secs(60)).await
    }

    pub async fn allocated_status(&mut self, namespace: &str, pod: &str) -> Value {
        self.call(json!({"cmd": "allocated-status", "namespace": namespace, "pod": pod}), Duration::from_secs(30)).await
    }

    /// Everything the plugin manager's handler and the health stream did so far.
    pub async fn events(&mut self) -> Vec<Value> {
        let a = self.call(json!({"cmd": "events"}), Duration::from_secs(10)).await;
        a["events"].as_array().cloned().unwrap_or_default()
    }

    /// A crash: SIGKILL, nothing cleaned up (the kubelet's own checkpoint stays).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_tail(&self, n: usize) -> String {
        super::logs::file_tail("migdra-kubelet", &self.log, n)
    }
}

impl Drop for KubeletCode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Milliseconds between two instants of the test's clock, `b` after `a`.
pub fn ms_between(a: SystemTime, b: SystemTime) -> i64 {
    match b.duration_since(a) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// A `unix_ms` field of the harness as a time of the test's clock.
pub fn unix_ms(v: &Value) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(v.as_u64().unwrap_or(0))
}
