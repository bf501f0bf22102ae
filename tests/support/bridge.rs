//! The real slurm-bridge (`hack/build-bridge.sh` builds it from the peers' source archives): its
//! scheduler, controllers and admission webhook, run on this machine against a control plane and
//! a Slurm with JWT ([`super::slurm`]), configured as the bridge's Helm chart configures them:
//! the chart's scheduler profile and feature gates, its `config.yaml` at
//! `/etc/slurm-bridge/config.yaml` (bound there in a private mount namespace, since the plugin
//! reads no other path but a debug one), `SLURM_JWT_FILE`, and the webhook with a certificate made
//! here. Differences from the chart, none of which the bridge's code sees: processes on this
//! machine rather than pods (no kube-proxy here to reach a webhook Service, so the webhook is
//! called by URL), the control plane's admin kubeconfig rather than the chart's RBAC, and no
//! leader election.

use super::controlplane::free_port;
use super::slurm::Slurm;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which build of the bridge: its commit as it is, or with migdra's patch series
/// (hack/slurm-bridge/patches, `hack/build-bridge.sh --patched`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Unchanged,
    Patched,
}

impl Variant {
    /// The variable naming its bin directory, and the script's flag that builds it.
    fn env_and_flag(self) -> (&'static str, Option<&'static str>) {
        match self {
            Self::Unchanged => ("MIGDRA_BRIDGE_BIN", None),
            Self::Patched => ("MIGDRA_BRIDGE_PATCHED_BIN", Some("--patched")),
        }
    }
}

/// The chart's scheduler name, which its webhook writes into the pods of managed namespaces.
pub const SCHEDULER: &str = "slurm-bridge-scheduler";
/// The Kubernetes node label naming the Slurm node (`internal/wellknown/labels.go`).
pub const SLURM_NODE_LABEL: &str = "slinky.slurm.net/slurm-nodename";
/// The pod annotations the bridge reads (`internal/wellknown/annotations.go`).
pub const GRES_ANNOTATION: &str = "slurmjob.slinky.slurm.net/gres";
pub const EXCLUSIVE_ANNOTATION: &str = "slurmjob.slinky.slurm.net/exclusive";
/// The taint the bridge's controllers put on every node they bridge.
pub const MANAGED_NODE_TAINT: &str = "slinky.slurm.net/managed-node";
/// The pod label carrying the Slurm job of a pod the bridge placed.
pub const JOB_LABEL: &str = "scheduler.slinky.slurm.net/slurm-jobid";
/// The webhook's fixed port (controller-runtime's default, which the bridge keeps).
const WEBHOOK_PORT: u16 = 9443;
const BINARIES: [&str; 3] = ["scheduler", "controllers", "admission"];

/// The bridge's bin directory: its variable, else where `hack/build-bridge.sh` puts the build of
/// this tree's pins and patches; `None` (after saying so) when the three binaries are not there
/// and `MIGDRA_REQUIRE_BRIDGE` is not 1. Under `.ci/run` the builds run in the background
/// (`MIGDRA_BRIDGE_BUILD_LOG` names their log): this waits for them.
pub fn bin_dir(variant: Variant) -> Option<PathBuf> {
    let (env, flag) = variant.env_and_flag();
    let dir = match std::env::var_os(env) {
        Some(d) => PathBuf::from(d),
        None => {
            let script = super::render::repo().join("hack/build-bridge.sh");
            let out = Command::new("bash").arg(script).args(flag).arg("--bin-dir").output().unwrap();
            assert!(out.status.success(), "build-bridge.sh --bin-dir: {}", String::from_utf8_lossy(&out.stderr));
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        }
    };
    if let Some(log) = std::env::var_os("MIGDRA_BRIDGE_BUILD_LOG") {
        let what = format!("slurm-bridge's build ({})", dir.display());
        super::background::wait_for(Path::new(&log), &what, "hack/build-bridge.sh");
    }
    if BINARIES.iter().all(|b| dir.join(b).is_file()) {
        return Some(dir);
    }
    let build = format!("bash hack/build-bridge.sh{}", flag.map(|f| format!(" {f}")).unwrap_or_default());
    super::skip::skip(
        super::skip::BRIDGE,
        &format!("slurm-bridge's binaries ({variant:?}) are not in {}: {build} builds them", dir.display()),
    );
    None
}

/// Which scheduler profile the bridge's scheduler runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The chart's, exactly: no `DynamicResources`, so kube-scheduler allocates no claim and
    /// every claim comes from the bridge's own PreBind.
    Chart,
    /// The chart's with `DynamicResources` added at each of its extension points (configuration
    /// only; the bridge's code is unchanged).
    WithDynamicResources,
}

/// The three processes, killed on drop.
pub struct Bridge {
    dir: PathBuf,
    bin: PathBuf,
    kubeconfig: PathBuf,
    token: PathBuf,
    processes: Vec<(&'static str, Child)>,
}

impl Drop for Bridge {
    #[allow(clippy::print_stdout)] // the logs of a failing test
    fn drop(&mut self) {
        for (_, child) in &mut self.processes {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            for (name, _) in &self.processes {
                println!("{}", super::logs::file_tail(name, &self.dir.join(format!("{name}.log")), 25));
            }
        }
    }
}

impl Bridge {
    /// Configure and start the bridge in `dir`: pods of `namespace` are managed, jobs go to
    /// `slurm`'s slurmrestd with its token, the scheduler runs `profile`. Creates the webhook
    /// configurations through `kubectl` and waits until the webhook serves.
    pub fn start(
        dir: &Path,
        bin: &Path,
        kubectl: &Path,
        kubeconfig: &Path,
        slurm: &Slurm,
        namespace: &str,
        profile: Profile,
    ) -> Self {
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        let rest = slurm.rest_url.as_deref().expect("slurm-bridge needs slurmrestd v0.0.44 (Slurm 25.11 or later)");
        // The chart's config.yaml (templates/configmap.yaml) with its default mcsLabel and partition.
        std::fs::write(
            dir.join("etc/config.yaml"),
            format!(
                "schedulerName: {SCHEDULER}\nslurmRestApi: {rest}\nmanagedNamespaces:\n- {namespace}\n\
                 mcsLabel: kubernetes\npartition: slurm-bridge\n"
            ),
        )
        .unwrap();
        let mut bridge = Self {
            dir: dir.to_path_buf(),
            bin: bin.to_path_buf(),
            kubeconfig: kubeconfig.to_path_buf(),
            token: slurm.token_file(),
            processes: Vec::new(),
        };
        bridge.start_scheduler(profile);
        let controllers = bridge.flags_of_controller_runtime();
        bridge.spawn("controllers", &controllers, None);
        bridge.start_admission(kubectl);
        bridge
    }

    /// Stop the scheduler and start it again with `profile`.
    pub fn restart_scheduler(&mut self, profile: Profile) {
        self.stop("scheduler");
        self.start_scheduler(profile);
    }

    /// Stop the controllers and start them again.
    pub fn restart_controllers(&mut self) {
        self.stop("controllers");
        let controllers = self.flags_of_controller_runtime();
        self.spawn("controllers", &controllers, None);
    }

    /// SIGKILL one of the bridge's processes, as a crash.
    fn stop(&mut self, name: &str) {
        if let Some(i) = self.processes.iter().position(|(n, _)| *n == name) {
            let (_, mut old) = self.processes.remove(i);
            let _ = old.kill();
            let _ = old.wait();
        }
    }

    /// A process's log, for a failure message.
    pub fn log(&self, name: &str) -> String {
        super::logs::file_tail(name, &self.dir.join(format!("{name}.log")), 40)
    }

    fn start_scheduler(&mut self, profile: Profile) {
        // The chart's profile (templates/scheduler/configmap.yaml): every default plugin off, these on.
        let dra = |point: &str| match (profile, point) {
            (
                Profile::WithDynamicResources,
                "preEnqueue" | "preFilter" | "filter" | "postFilter" | "reserve" | "preBind",
            ) => "\n          - name: DynamicResources",
            _ => "",
        };
        let config = format!(
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n\
             clientConnection:\n  kubeconfig: {kc}\nleaderElection:\n  leaderElect: false\n\
             profiles:\n- schedulerName: {SCHEDULER}\n  plugins:\n\
             \x20   queueSort:\n      enabled:\n          - name: PrioritySort\n\
             \x20   preEnqueue:\n      enabled:\n          - name: SlurmBridge{pe}\n\
             \x20   preFilter:\n      enabled:\n          - name: VolumeBinding\n\
             \x20         - name: NodeResourcesFit\n          - name: SlurmBridge{pf}\n\
             \x20   filter:\n      enabled:\n          - name: VolumeBinding\n          - name: TaintToleration\n\
             \x20         - name: NodeResourcesFit\n          - name: SlurmBridge{f}\n\
             \x20   postFilter:\n      enabled:\n          - name: SlurmBridge{pof}\n\
             \x20   reserve:\n      enabled:\n          - name: VolumeBinding{r}\n\
             \x20   preBind:\n      enabled:\n          - name: VolumeBinding\n          - name: SlurmBridge{pb}\n\
             \x20   bind:\n      enabled:\n          - name: DefaultBinder\n\
             \x20   multiPoint:\n      disabled:\n          - name: '*'\n\
             \x20 pluginConfig:\n  - name: SlurmBridge\n",
            kc = self.kubeconfig.display(),
            pe = dra("preEnqueue"),
            pf = dra("preFilter"),
            f = dra("filter"),
            pof = dra("postFilter"),
            r = dra("reserve"),
            pb = dra("preBind"),
        );
        let file = self.dir.join("scheduler-config.yaml");
        std::fs::write(&file, config).unwrap();
        let args = vec![
            format!("--config={}", file.display()),
            // The chart's gates (templates/scheduler/deployment.yaml).
            "--feature-gates=DRAExtendedResource=true,DynamicResourceAllocation=true,SchedulerPopFromBackoffQ=false"
                .into(),
            "--secure-port=0".into(),
            "--v=4".into(),
        ];
        // The plugin reads /etc/slurm-bridge/config.yaml, where the chart mounts its ConfigMap.
        std::fs::create_dir_all("/etc/slurm-bridge").unwrap();
        self.spawn("scheduler", &args, Some((self.dir.join("etc"), PathBuf::from("/etc/slurm-bridge"))));
    }

    /// The flags controllers and admission share: their config, no metrics, a free probe port.
    fn flags_of_controller_runtime(&self) -> Vec<String> {
        vec![
            format!("--config={}", self.dir.join("etc/config.yaml").display()),
            "--metrics-bind-address=0".into(),
            format!("--health-probe-bind-address=127.0.0.1:{}", free_port()),
            "--leader-elect=false".into(),
        ]
    }

    /// The webhook: a CA and a serving certificate for 127.0.0.1, the binary serving it from
    /// controller-runtime's certificate directory, and the chart's two webhook configurations
    /// (templates/admission/webhook.yaml) calling it by URL.
    fn start_admission(&mut self, kubectl: &Path) {
        assert!(
            TcpStream::connect(("127.0.0.1", WEBHOOK_PORT)).is_err(),
            "port {WEBHOOK_PORT}, the bridge's webhook port, is taken"
        );
        let certs = self.dir.join("certs");
        std::fs::create_dir_all(&certs).unwrap();
        // The control plane's CA and serving certificate for 127.0.0.1, under the names
        // controller-runtime's webhook server reads.
        super::controlplane::certificates(&certs, None);
        std::fs::rename(certs.join("apiserver.crt"), certs.join("tls.crt")).unwrap();
        std::fs::rename(certs.join("apiserver.key"), certs.join("tls.key")).unwrap();
        let args = self.flags_of_controller_runtime();
        let serving = PathBuf::from("/tmp/k8s-webhook-server/serving-certs");
        std::fs::create_dir_all(&serving).unwrap();
        self.spawn("admission", &args, Some((certs.clone(), serving)));
        let ca = Command::new("openssl").args(["base64", "-A", "-in", "ca.crt"]).current_dir(&certs).output().unwrap();
        let ca = String::from_utf8(ca.stdout).unwrap();
        let webhook = |kind: &str, path: &str| {
            format!(
                "apiVersion: admissionregistration.k8s.io/v1\nkind: {kind}\nmetadata:\n  name: slurm-bridge-admission\n\
                 webhooks:\n- name: pods.slinky.slurm.net\n  namespaceSelector:\n    matchExpressions:\n\
                 \x20   - key: kubernetes.io/metadata.name\n      operator: NotIn\n\
                 \x20     values: [kube-system, slurm-bridge]\n\
                 \x20 rules:\n  - apiGroups: [\"\"]\n    apiVersions: [v1]\n    resources: [pods]\n\
                 \x20   operations: [CREATE, UPDATE]\n    scope: Namespaced\n\
                 \x20 clientConfig:\n    url: https://127.0.0.1:{WEBHOOK_PORT}{path}\n    caBundle: {ca}\n\
                 \x20 admissionReviewVersions: [v1]\n  sideEffects: None\n"
            )
        };
        let file = self.dir.join("webhooks.yaml");
        std::fs::write(
            &file,
            format!(
                "{}---\n{}",
                webhook("MutatingWebhookConfiguration", "/mutate--v1-pod"),
                webhook("ValidatingWebhookConfiguration", "/validate--v1-pod")
            ),
        )
        .unwrap();
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", WEBHOOK_PORT)).is_err() {
            self.assert_running();
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the webhook did not listen in 60 s\n{}",
                self.log("admission")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let out = Command::new(kubectl)
            .args(["--kubeconfig", self.kubeconfig.to_str().unwrap(), "apply", "-f", file.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "kubectl apply webhooks: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Start `name` with `args`, its output in `<name>.log`; with `bind` (`from`, `onto`), in a
    /// private mount namespace with `from` bound onto `onto`, as the chart mounts a volume.
    fn spawn(&mut self, name: &'static str, args: &[String], bind: Option<(PathBuf, PathBuf)>) {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join(format!("{name}.log"))).unwrap();
        let program = self.bin.join(name);
        let mut cmd = match &bind {
            Some((from, onto)) => {
                let mut c = Command::new("unshare");
                c.args([
                    "--mount",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    "mount --bind \"$1\" \"$2\" && shift 2 && exec \"$@\"",
                ])
                .arg("sh")
                .arg(from)
                .arg(onto)
                .arg(&program);
                c
            }
            None => Command::new(&program),
        };
        let child = cmd
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("SLURM_JWT_FILE", &self.token)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
        self.processes.push((name, child));
        std::thread::sleep(Duration::from_millis(500));
        self.assert_running();
    }

    /// Panics with its log when a process has exited.
    pub fn assert_running(&mut self) {
        for i in 0..self.processes.len() {
            let (name, child) = &mut self.processes[i];
            if let Ok(Some(status)) = child.try_wait() {
                let name = *name;
                panic!("slurm-bridge's {name} exited: {status}\n{}", self.log(name));
            }
        }
    }
}
