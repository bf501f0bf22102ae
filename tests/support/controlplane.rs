//! A real Kubernetes control plane for end-to-end tests: etcd, kube-apiserver, kube-scheduler and
//! kube-controller-manager, built from Go modules by `hack/build-controlplane.sh`.
//!
//! - Binaries come from `$MIGDRA_CONTROLPLANE_BIN`, else the newest Kubernetes version among
//!   `${MIGDRA_CACHE:-~/.cache/migdra}/controlplane-*/bin`. Missing binaries fail the test with
//!   the command that builds them; nothing is skipped silently.
//! - Everything lives in a temporary directory: etcd's data, certificates made with the `openssl`
//!   CLI (a CA, the API server's serving certificate for 127.0.0.1, the service-account key
//!   pair), a static admin token (group `system:masters`), each component's log, and the
//!   kubeconfig `migdra serve --kubeconfig` and the other components use.
//! - Ports are free localhost ports; the API server authorizes with RBAC and runs with
//!   [`FEATURE_GATES`] on every component.
//! - Dropping it kills every process; if the test is failing, the tail of each log is printed
//!   (and the directory kept with `MIGDRA_KEEP_CONTROLPLANE=1`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Gates the DRA tests need, given to kube-apiserver, kube-scheduler and kube-controller-manager.
/// Both are beta and on by default from 1.36; naming them keeps the tests honest on other versions.
pub const FEATURE_GATES: &str = "DRAPartitionableDevices=true,DRAResourceClaimDeviceStatus=true";

/// The controllers that turn ResourceClaimTemplates into ResourceClaims, deallocate claims of
/// deleted pods, and delete generated claims once their pod is gone.
pub const CONTROLLERS: &str = "resourceclaim-controller,garbage-collector-controller";

const BINARIES: [&str; 4] = ["etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"];

/// What ran, for the test's report.
#[derive(Debug, Clone)]
pub struct Versions {
    pub apiserver: String,
    pub etcd: String,
    pub bin_dir: PathBuf,
}

impl Versions {
    /// The API server's minor version, e.g. 37 for v1.37.2. Panics on a version it cannot read:
    /// a gate on an unknown version would otherwise skip its test silently.
    pub fn minor(&self) -> u32 {
        self.apiserver
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("cannot read the minor version of kube-apiserver {:?}", self.apiserver))
    }
}

impl std::fmt::Display for Versions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kube-apiserver, kube-scheduler, kube-controller-manager {}, etcd {} (from {}), \
             feature gates {FEATURE_GATES}",
            self.apiserver,
            self.etcd,
            self.bin_dir.display()
        )
    }
}

struct Process {
    name: &'static str,
    child: Child,
    log: PathBuf,
    /// How it was started, so that [`ControlPlane::restart`] starts it the same way.
    program: PathBuf,
    args: Vec<String>,
}

/// A running control plane; killed on drop.
pub struct ControlPlane {
    dir: Option<tempfile::TempDir>,
    /// In start order; killed in reverse.
    processes: Vec<Process>,
    kubeconfig: PathBuf,
    pub url: String,
    pub versions: Versions,
    /// How long the start took, up to a ready API server and both controllers running.
    pub startup: Duration,
}

/// The directory holding the four binaries, or a panic that says how to build them.
pub fn bin_dir() -> PathBuf {
    let help = "build the control plane first: `bash hack/build-controlplane.sh` (cached; it prints the bin \
                directory as its last line), then export MIGDRA_CONTROLPLANE_BIN=<that directory> or rerun \
                `bash hack/test.sh`, which does both";
    let dir = match std::env::var_os("MIGDRA_CONTROLPLANE_BIN") {
        Some(d) => PathBuf::from(d),
        None => {
            let cache = cache_dir();
            let newest = std::fs::read_dir(&cache).ok().and_then(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("controlplane-"))
                    .map(|e| e.path().join("bin"))
                    .filter(|bin| BINARIES.iter().all(|b| bin.join(b).is_file()))
                    .max_by_key(|bin| (kube_version(bin), bin.metadata().and_then(|m| m.modified()).ok()))
            });
            newest.unwrap_or_else(|| {
                panic!("no Kubernetes control plane binaries under {}/controlplane-*/bin: {help}", cache.display())
            })
        }
    };
    for b in BINARIES {
        assert!(dir.join(b).is_file(), "{} is missing: {help}", dir.join(b).display());
    }
    dir
}

/// Where hack/build-controlplane.sh keeps its builds: `$MIGDRA_CACHE`, else `~/.cache/migdra`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("MIGDRA_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/migdra"),
        PathBuf::from,
    )
}

/// A Kubernetes release of the test matrix: the module dir `hack/build-controlplane.sh` builds
/// it from and the variable that may name its bin directory.
#[derive(Debug, Clone, Copy)]
pub struct Release {
    pub minor: u32,
    pub env: &'static str,
    pub module: &'static str,
}

pub const K138: Release = Release { minor: 38, env: "MIGDRA_CONTROLPLANE_138_BIN", module: "hack/controlplane-1.38" };
pub const K137: Release = Release { minor: 37, env: "MIGDRA_CONTROLPLANE_137_BIN", module: "hack/controlplane-1.37" };
pub const K136: Release = Release { minor: 36, env: "MIGDRA_CONTROLPLANE_136_BIN", module: "hack/controlplane-1.36" };

/// The release of the matrix whose minor version is `minor`, if there is one.
pub fn release(minor: u32) -> Option<Release> {
    [K138, K137, K136].into_iter().find(|r| r.minor == minor)
}

/// The bin directory of `release` holding `binaries`: `$<release.env>`, else the newest patch in
/// the cache; or a panic that says how to build it.
pub fn release_dir(release: Release, binaries: &[&str]) -> PathBuf {
    let help = format!(
        "build it first: `bash hack/build-controlplane.sh {}` (cached; it prints the bin directory as its last \
         line), then export {}=<that directory>, or run `bash hack/test.sh`, which does both",
        release.module, release.env
    );
    let dir = match std::env::var_os(release.env) {
        Some(d) => PathBuf::from(d),
        None => {
            let cache = cache_dir();
            std::fs::read_dir(&cache)
                .ok()
                .and_then(|entries| {
                    entries
                        .flatten()
                        .filter(|e| e.file_name().to_string_lossy().starts_with("controlplane-"))
                        .map(|e| e.path().join("bin"))
                        .filter(|bin| kube_version(bin).0 == release.minor)
                        .filter(|bin| binaries.iter().all(|b| bin.join(b).is_file()))
                        .max_by_key(|bin| kube_version(bin))
                })
                .unwrap_or_else(|| panic!("no Kubernetes 1.{} under {}: {help}", release.minor, cache.display()))
        }
    };
    for b in binaries {
        assert!(dir.join(b).is_file(), "{} is missing: {help}", dir.join(b).display());
    }
    dir
}

/// `(minor, patch)` of `…/controlplane-v1.<minor>.<patch>-…/bin`, so the newest Kubernetes wins.
fn kube_version(bin: &Path) -> (u32, u32) {
    let dir = bin.parent().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let version = dir.trim_start_matches("controlplane-v1.");
    let mut parts = version.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free localhost port").port()
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("openssl {args:?}: {e} (the control plane tests need the openssl CLI)"));
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA, a serving certificate for 127.0.0.1 (and `extra_ip`) signed by it, and the
/// service-account key pair; all P-256 keys, which Go and rustls both take and openssl makes fast.
/// In `dir`: `ca.crt`, `apiserver.crt` and `apiserver.key` (also the bridge's webhook's), `sa.key`.
pub fn certificates(dir: &Path, extra_ip: Option<&str>) {
    let key = |name: &str| {
        openssl(dir, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name])
    };
    key("ca.key");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=migdra-test-ca",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
    key("apiserver.key");
    openssl(dir, &["req", "-new", "-key", "apiserver.key", "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver"]);
    let extra = extra_ip.map(|ip| format!(",IP:{ip}")).unwrap_or_default();
    std::fs::write(
        dir.join("apiserver.ext"),
        format!(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n\
             subjectAltName=IP:127.0.0.1{extra},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\n"
        ),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "apiserver.crt",
            "-days",
            "2",
            "-extfile",
            "apiserver.ext",
        ],
    );
    key("sa.key");
    openssl(dir, &["pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
}

impl ControlPlane {
    /// Start etcd, kube-apiserver (waits for `/readyz`), kube-scheduler and
    /// kube-controller-manager.
    pub async fn start() -> Self {
        Self::start_from(bin_dir(), None, None, None).await
    }

    /// [`Self::start`] with the four binaries of `bin` (another Kubernetes version, as the scale
    /// benchmark compares them), and the scheduler's and controller manager's client limits
    /// raised to `qps` (burst twice that): at their defaults (50 and 20 requests/s) the claim
    /// controller, not the scheduler, would set the pace of a benchmark.
    pub async fn start_in(bin: PathBuf, qps: u32) -> Self {
        Self::start_from(bin, None, Some(qps), None).await
    }

    /// [`Self::start`] with the control plane of `release`.
    pub async fn start_release(release: Release) -> Self {
        Self::start_from(release_dir(release, &BINARIES), None, None, None).await.of_release(release)
    }

    /// [`Self::start_release`] for real nodes (`support::kubenode`) whose pods reach the API server
    /// at `pod_gateway` (the pod bridge's address on this host; no kube-proxy runs): the API
    /// server also listens there and its certificate names it; service accounts are admitted and
    /// their tokens mounted; the controllers a node's pods need run too.
    pub async fn start_for_nodes(release: Release, pod_gateway: &str) -> Self {
        Self::start_from(release_dir(release, &BINARIES), None, None, Some(pod_gateway)).await.of_release(release)
    }

    /// Itself, once its API server says it is of `release`: a variable naming another release's
    /// build fails the test rather than testing the wrong release.
    fn of_release(self, release: Release) -> Self {
        assert_eq!(
            self.versions.minor(),
            release.minor,
            "{} names {}, not 1.{}",
            release.env,
            self.versions,
            release.minor
        );
        self
    }

    /// Only etcd and the kube-apiserver found in `apiserver_dir` (another Kubernetes version),
    /// with `gates` (e.g. `DRADeviceTaints=false`) beside [`FEATURE_GATES`]; no scheduler or
    /// controller manager, which must not be newer than the API server.
    pub async fn start_apiserver_only(apiserver_dir: PathBuf, gates: &str) -> Self {
        Self::start_from(bin_dir(), Some((apiserver_dir, gates)), None, None).await
    }

    async fn start_from(
        bin: PathBuf,
        apiserver: Option<(PathBuf, &str)>,
        qps: Option<u32>,
        pod_gateway: Option<&str>,
    ) -> Self {
        super::logs::remember_panics();
        let t0 = Instant::now();
        let (api_bin, api_gates) = match &apiserver {
            Some((dir, gates)) => (dir.clone(), format!("{FEATURE_GATES},{gates}")),
            None => (bin.clone(), FEATURE_GATES.to_string()),
        };
        let dir = tempfile::Builder::new().prefix("migdra-controlplane-").tempdir().unwrap();
        let d = dir.path().to_path_buf();
        certificates(&d, pod_gateway);
        let token = format!("migdra-admin-{:x}", t0.elapsed().as_nanos() ^ u128::from(std::process::id()));
        std::fs::write(d.join("tokens.csv"), format!("{token},admin,admin-uid,\"system:masters\"\n")).unwrap();
        let (etcd_client, etcd_peer, api_port) = (free_port(), free_port(), free_port());
        let url = format!("https://127.0.0.1:{api_port}");
        let kubeconfig = d.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    \
                 certificate-authority: {ca}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    \
                 user: admin\n    namespace: default\ncurrent-context: test\nusers:\n- name: admin\n  user:\n    \
                 token: {token}\n",
                ca = d.join("ca.crt").display()
            ),
        )
        .unwrap();

        let etcd_version = Command::new(bin.join("etcd"))
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").replace("etcd Version: ", ""))
            .unwrap_or_default();
        let mut cp = Self {
            dir: Some(dir),
            processes: Vec::new(),
            kubeconfig: kubeconfig.clone(),
            url: url.clone(),
            versions: Versions { apiserver: String::new(), etcd: etcd_version, bin_dir: bin.clone() },
            startup: Duration::ZERO,
        };
        let client_url = format!("http://127.0.0.1:{etcd_client}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer}");
        cp.spawn(
            "etcd",
            &bin,
            &[
                "--name=test".into(),
                format!("--data-dir={}", d.join("etcd").display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=test={peer_url}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ],
        );
        let p = |name: &str| d.join(name).display().to_string();
        // For real nodes: every address (the pod bridge's appears only with the first pod), and
        // service-account tokens in pods; Nodes still get no not-ready taint (no node lifecycle
        // controller runs).
        let (bind, admission_off) = match pod_gateway {
            Some(_) => ("0.0.0.0", "TaintNodesByCondition"),
            None => ("127.0.0.1", "ServiceAccount,TaintNodesByCondition"),
        };
        cp.spawn(
            "kube-apiserver",
            &api_bin,
            &[
                format!("--etcd-servers={client_url}"),
                format!("--bind-address={bind}"),
                "--advertise-address=127.0.0.1".into(),
                // 1.37 refuses a loopback address for the `kubernetes` Service's endpoints, which
                // no test uses (no pod runs here).
                "--endpoint-reconciler-type=none".into(),
                format!("--secure-port={api_port}"),
                format!("--cert-dir={}", p("apiserver-certs")),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--token-auth-file={}", p("tokens.csv")),
                "--authorization-mode=RBAC".into(),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                // No kubelet and no service-account controller run here: new Nodes would keep the
                // not-ready taint, and pods would wait for a `default` ServiceAccount.
                format!("--disable-admission-plugins={admission_off}"),
                // exec and logs reach a kubelet at its InternalIP (no name lookup for a node).
                "--kubelet-preferred-address-types=InternalIP".into(),
                "--runtime-config=resource.k8s.io/v1=true".into(),
                // Privileged containers allowed, as every cluster that runs a GPU driver's pods
                // sets it (kubeadm, kind); the default refuses migdra's DaemonSet.
                "--allow-privileged=true".into(),
                format!("--feature-gates={api_gates}"),
                "--profiling=false".into(),
                "--v=1".into(),
            ],
        );
        let client = cp.client().await;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            cp.assert_running();
            let readyz = hyper::Request::get("/readyz").body(Vec::new()).unwrap();
            match client.request_text(readyz).await {
                Ok(body) if body.trim() == "ok" => break,
                other => {
                    assert!(Instant::now() < deadline, "kube-apiserver not ready after 120 s: {other:?}\n{}", cp.logs())
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        cp.versions.apiserver = client.apiserver_version().await.map(|v| v.git_version).unwrap_or_default();
        if apiserver.is_some() {
            cp.startup = t0.elapsed();
            return cp;
        }
        let kc = kubeconfig.display().to_string();
        let common = |port: u16| {
            let mut args = vec![
                format!("--kubeconfig={kc}"),
                "--leader-elect=false".into(),
                format!("--feature-gates={FEATURE_GATES}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                "--v=2".into(),
            ];
            if let Some(qps) = qps {
                args.extend([format!("--kube-api-qps={qps}"), format!("--kube-api-burst={}", 2 * qps)]);
            }
            args
        };
        // Its secure port (pprof, metrics) asks the API server who a token is and what it may do.
        let mut scheduler = common(free_port());
        scheduler.extend([format!("--authentication-kubeconfig={kc}"), format!("--authorization-kubeconfig={kc}")]);
        cp.spawn("kube-scheduler", &bin, &scheduler);
        let mut kcm = common(free_port());
        let controllers = match pod_gateway {
            // Each namespace's `default` ServiceAccount and its kube-root-ca.crt, which every
            // pod's token volume needs; the DaemonSet's pods; deleting a namespace.
            Some(_) => {
                kcm.push(format!("--root-ca-file={}", p("ca.crt")));
                format!(
                    "{CONTROLLERS},serviceaccount-controller,\
                     root-ca-certificate-publisher-controller,daemonset-controller,namespace-controller"
                )
            }
            None => CONTROLLERS.to_string(),
        };
        kcm.extend([
            format!("--controllers={controllers}"),
            "--use-service-account-credentials=false".into(),
            format!("--cert-dir={}", p("kcm-certs")),
        ]);
        cp.spawn("kube-controller-manager", &bin, &kcm);
        // Both start within a second or two; one that exits at once (a bad flag) fails here.
        tokio::time::sleep(Duration::from_secs(1)).await;
        cp.assert_running();
        cp.startup = t0.elapsed();
        cp
    }

    fn spawn(&mut self, name: &'static str, bin: &Path, args: &[String]) {
        let log = self.dir().join(format!("{name}.log"));
        let program = bin.join(name);
        let child = self.launch(&program, args, &log);
        self.processes.push(Process { name, child, log, program, args: args.to_vec() });
    }

    /// Start a component, its output appended to its log.
    fn launch(&self, program: &Path, args: &[String], log: &Path) -> Child {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        Command::new(program)
            .args(args)
            .current_dir(self.dir())
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()))
    }

    /// Kill one component (SIGKILL, as a crash) and leave it down until [`Self::restart`].
    pub fn stop(&mut self, name: &str) {
        let i = self.processes.iter().position(|p| p.name == name).unwrap_or_else(|| panic!("no component {name}"));
        let _ = self.processes[i].child.kill();
        let _ = self.processes[i].child.wait();
    }

    /// Kill one component (SIGKILL, as a crash) and start it again with the same flags; its log
    /// goes on in the same file.
    pub fn restart(&mut self, name: &str) {
        let i = self.processes.iter().position(|p| p.name == name).unwrap_or_else(|| panic!("no component {name}"));
        let _ = self.processes[i].child.kill();
        let _ = self.processes[i].child.wait();
        let p = &self.processes[i];
        let child = self.launch(&p.program, &p.args, &p.log);
        self.processes[i].child = child;
    }

    fn dir(&self) -> PathBuf {
        self.dir.as_ref().expect("the control plane directory").path().to_path_buf()
    }

    /// The kubeconfig for `migdra serve --kubeconfig` (admin token, the test CA).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kubeconfig next to the admin one whose user impersonates `user` with `groups` and the
    /// user extras `extra` (the admin is in `system:masters`, so it may impersonate anyone).
    pub fn impersonating_kubeconfig(&self, user: &str, groups: &[&str], extra: &[(&str, &str)]) -> PathBuf {
        let mut kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("read the kubeconfig");
        for named in &mut kc.auth_infos {
            let auth = named.auth_info.as_mut().expect("the admin user");
            auth.impersonate = Some(user.into());
            auth.impersonate_groups = Some(groups.iter().map(|g| (*g).into()).collect());
            auth.impersonate_user_extra =
                Some(extra.iter().map(|(k, v)| ((*k).to_string(), vec![(*v).to_string()])).collect());
        }
        let path = self.dir().join(format!("kubeconfig-as-{}", user.replace(':', "-")));
        std::fs::write(&path, serde_norway::to_string(&kc).expect("serialize the kubeconfig")).unwrap();
        path
    }

    /// A client with the admin token.
    pub async fn client(&self) -> kube::Client {
        Self::client_from(&self.kubeconfig).await
    }

    /// A client from a kubeconfig, such as [`Self::impersonating_kubeconfig`].
    pub async fn client_from(kubeconfig: &Path) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("a client config from the kubeconfig");
        kube::Client::try_from(config).expect("a client")
    }

    /// Panics, with the logs, if a component has exited.
    pub fn assert_running(&mut self) {
        let mut exited = Vec::new();
        for p in &mut self.processes {
            if let Ok(Some(status)) = p.child.try_wait() {
                exited.push(format!("{} exited: {status}", p.name));
            }
        }
        assert!(exited.is_empty(), "{}\n{}", exited.join("\n"), self.logs());
    }

    /// The last lines of every component's log.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for p in &self.processes {
            out.push_str(&super::logs::file_tail(p.name, &p.log, 30));
            out.push('\n');
        }
        out
    }

    /// The process ID of one component.
    pub fn pid(&self, name: &str) -> u32 {
        self.process(name).child.id()
    }

    /// The secure (HTTPS) port one component serves on: /metrics and /debug/pprof for the admin.
    pub fn secure_port(&self, name: &str) -> u16 {
        let p = self.process(name);
        p.args
            .iter()
            .find_map(|a| a.strip_prefix("--secure-port=")?.parse().ok())
            .unwrap_or_else(|| panic!("{name} has no --secure-port"))
    }

    fn process(&self, name: &str) -> &Process {
        self.processes.iter().find(|p| p.name == name).unwrap_or_else(|| panic!("no component {name}"))
    }

    /// The full log of one component.
    pub fn log(&self, name: &str) -> String {
        self.processes
            .iter()
            .find(|p| p.name == name)
            .map_or_else(String::new, |p| std::fs::read_to_string(&p.log).unwrap_or_default())
    }
}

impl Drop for ControlPlane {
    #[allow(clippy::print_stderr)] // what a failing test leaves behind
    fn drop(&mut self) {
        for p in self.processes.iter_mut().rev() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
            // etcd's files take over 100 MB, so the directory stays only on request.
            if std::env::var_os("MIGDRA_KEEP_CONTROLPLANE").is_some()
                && let Some(dir) = self.dir.take()
            {
                eprintln!("control plane directory kept: {}", dir.keep().display());
            } else {
                eprintln!("set MIGDRA_KEEP_CONTROLPLANE=1 to keep the control plane's directory");
            }
            super::logs::repeat_failure();
        }
    }
}
