//! `migdra serve` as a child process on a [`NodeDir`]: [`Serve`] collects its flags and
//! environment; the [`Daemon`] it starts waits for its registration socket, puts its log in the
//! failure message of a wait and prints it when the test fails, and is SIGKILLed when dropped.

use super::DRIVER;
use super::eventually::eventually;
use super::logs::{file_tail, tail};
use super::node::NodeDir;
use migdra::kubelet::client::TestKubelet;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, SystemTime};

/// How long a daemon may take to register: a bound for a failure, not a target.
const READY_WITHIN: Duration = Duration::from_secs(20);
/// How often to try the registration socket: short, so a bench that times the start sees it.
const READY_EVERY: Duration = Duration::from_micros(500);
/// Log lines shown when a test fails.
const LOG_LINES: usize = 60;

/// A `migdra serve` to start on a node: `serve` with the node's flags, its plugin and registry
/// directories, 100 ms health and socket checks (tests wait less), then what the test adds.
#[must_use = "a Serve starts nothing until spawn or ready"]
pub struct Serve<'a> {
    node: &'a NodeDir,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    pod_uid: Option<String>,
    quick_checks: bool,
}

impl<'a> Serve<'a> {
    pub(super) fn new(node: &'a NodeDir) -> Self {
        Self { node, args: Vec::new(), env: Vec::new(), pod_uid: None, quick_checks: true }
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(|a| a.as_ref().into()));
        self
    }

    /// An environment variable for this daemon alone (`MIGDRA_SIM_FAULTS`, `MIGDRA_CRASH_AT`).
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env.push((key.as_ref().into(), value.as_ref().into()));
        self
    }

    /// `POD_UID`, as the DaemonSet sets it: both socket names carry it (a rolling update runs
    /// two pods side by side).
    pub fn pod_uid(mut self, uid: &str) -> Self {
        self.pod_uid = Some(uid.into());
        self.env("POD_UID", uid)
    }

    /// migdra's own health and socket-check intervals instead of the tests' 100 ms.
    pub fn default_intervals(mut self) -> Self {
        self.quick_checks = false;
        self
    }

    /// The command, for a test that runs it to the end itself (one that must fail at start).
    pub fn command(&self) -> Command {
        let node = self.node;
        let mut cmd = super::command::migdra();
        cmd.arg("serve").args(node.flags()).arg("--registry-dir").arg(node.registry_dir());
        node.without_host_slurm(&mut cmd);
        if self.quick_checks {
            cmd.args(["--health-interval", "100ms", "--socket-check", "100ms"]);
        }
        cmd.args(&self.args).envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Start it without waiting.
    pub fn spawn(self) -> Daemon {
        let node = self.node;
        let log = node.next_log();
        let mut cmd = self.command();
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        cmd.stderr(std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display())));
        let (dra, registration) = match &self.pod_uid {
            Some(p) => (format!("dra-{p}.sock"), format!("{DRIVER}-{p}-reg.sock")),
            None => ("dra.sock".to_string(), format!("{DRIVER}-reg.sock")),
        };
        let started = SystemTime::now();
        let child = cmd.spawn().unwrap_or_else(|e| panic!("{}: {e}", super::command::describe(&cmd)));
        Daemon {
            child,
            registration: node.registry_dir().join(registration),
            dra: node.plugin_dir().join(dra),
            log,
            started,
        }
    }

    /// Start it and wait until its registration socket answers.
    pub async fn ready(self) -> Daemon {
        let mut daemon = self.spawn();
        daemon.wait_ready().await;
        daemon
    }

    /// Start it, wait, and register as the kubelet does.
    pub async fn registered(self) -> (Daemon, TestKubelet) {
        let daemon = self.ready().await;
        let kubelet = daemon.register().await;
        (daemon, kubelet)
    }
}

/// A running `migdra serve`; SIGKILLed when dropped, its log printed if the test is failing.
pub struct Daemon {
    child: Child,
    /// The registration socket the kubelet's plugin watcher finds.
    pub registration: PathBuf,
    /// The DRA socket, the endpoint registration names.
    pub dra: PathBuf,
    log: PathBuf,
    /// When it was started, by the test's clock.
    pub started: SystemTime,
}

impl Daemon {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Where its stderr goes.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last lines of its log, under a line naming it: for a failure message.
    pub fn log_tail(&self) -> String {
        file_tail(&format!("migdra serve (pid {})", self.pid()), &self.log, LOG_LINES)
    }

    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("the daemon's status").is_none()
    }

    /// Until the registration socket accepts connections (a stale socket of a killed daemon
    /// refuses them).
    ///
    /// # Panics
    /// If the daemon exits first, or after 20 s; with its log.
    pub async fn wait_ready(&mut self) {
        let log = self.log.clone();
        let (child, registration) = (&mut self.child, &self.registration);
        eventually(format!("a registration socket at {}", registration.display()))
            .within(READY_WITHIN)
            .every(READY_EVERY)
            .explain(|| file_tail("migdra serve", &log, LOG_LINES))
            .until(|| {
                if let Some(status) = child.try_wait().expect("the daemon's status") {
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    panic!("migdra serve exited ({status}) before it was ready:\n{}", tail(&text, LOG_LINES));
                }
                std::os::unix::net::UnixStream::connect(registration).is_ok()
            })
            .await;
    }

    /// Register as the kubelet does.
    pub async fn register(&self) -> TestKubelet {
        match TestKubelet::register(&self.registration).await {
            Ok(k) => k,
            Err(e) => panic!("registration failed: {e}\n{}", self.log_tail()),
        }
    }

    /// The exit status, if the process ends within `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let (child, mut status) = (&mut self.child, None);
        eventually("the daemon to exit")
            .within(timeout)
            .measure(|| {
                status = child.try_wait().expect("the daemon's status");
                status.is_some()
            })
            .await;
        status
    }

    /// Send `signal` (a name `kill` takes: TERM, STOP, CONT); does not wait.
    pub fn signal(&self, signal: &str) {
        let status =
            Command::new("kill").args([&format!("-{signal}"), &self.pid().to_string()]).status().expect("run kill");
        assert!(status.success(), "kill -{signal} {}: {status}", self.pid());
    }

    /// SIGTERM, as the kubelet stops a pod; does not wait.
    pub fn sigterm(&self) {
        self.signal("TERM");
    }

    /// SIGTERM, then its exit status.
    ///
    /// # Panics
    /// If it still runs after `grace`; with its log.
    pub async fn terminate(&mut self, grace: Duration) -> ExitStatus {
        self.sigterm();
        match self.wait_exit(grace).await {
            Some(status) => status,
            None => panic!("migdra serve still running {grace:?} after SIGTERM\n{}", self.log_tail()),
        }
    }

    /// SIGKILL, as a crash, and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    #[allow(clippy::print_stderr)] // what a failing test leaves behind
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
    }
}
