//! migdra as it is deployed, on a real node: the kubelet binary, containerd and runc
//! (`support::kubenode`) joined to a real control plane of the kubelet's release (1.37 in the
//! whole suite; `hack/test.sh` runs the chart's test again on a 1.38 node). The chart is installed with helm as
//! daemonset/README.md says, on simulated GPUs (`simulation.gpus`); the DaemonSet's pod becomes
//! Ready through the kubelet's exec probes, authenticates with its service account, publishes and
//! registers through the chart's hostPath directories under a non-default kubelet root dir. Users'
//! pods then run in real containers and are checked from inside.
//!
//! One test, in steps, each printed with its time: the node is a shared, stateful thing, and
//! each step starts from what the one before left.

/// The real slurm-bridge beside migdra on this node (tests/node/bridge.rs).
mod bridge;
#[path = "../support/mod.rs"]
mod support;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::controlplane::ControlPlane;
use support::eventually::eventually;
use support::kubenode::{self, KubeNode, POD_GATEWAY, WORKLOAD_IMAGE};

const NODE_NAME: &str = "gpu-node-1";
const GPUS: &str = "h100-80gb:1,a100-40gb:1:mig-off";
const CHART_NS: &str = "migdra-system";
const USERS: &str = "team-a";
/// The images the examples name, served by the workload image (no registry here).
const EXAMPLE_IMAGES: [&str; 2] =
    ["quay.io/jupyter/pytorch-notebook:cuda12-latest", "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"];

/// One node at a time: every node uses the same bridge and the same pod network.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The steps' clock: each line says how long since the start.
struct Steps(Instant);

impl Steps {
    #[allow(clippy::print_stdout)] // the test's report
    fn say(&self, what: &str) {
        println!("[{:>6.1} s] {what}", self.0.elapsed().as_secs_f64());
    }
}

/// kubectl and helm as an operator runs them, against the test's control plane.
struct Ops {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
    helm: PathBuf,
    /// The node's directory: files to apply, and its kubelet's log for failures.
    node_dir: PathBuf,
}

impl Ops {
    fn new(node: &KubeNode, kubeconfig: &Path, helm: PathBuf) -> Self {
        Self { kubectl: node.bin.join("kubectl"), kubeconfig: kubeconfig.to_path_buf(), helm, node_dir: node.dir() }
    }

    fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["--kubeconfig", self.kubeconfig.to_str().unwrap()];
        all.extend_from_slice(args);
        kubenode::run(&self.kubectl, &all)
    }

    /// kubectl whatever its exit: (success, stdout + stderr).
    fn try_kubectl(&self, args: &[&str]) -> (bool, String) {
        let mut all = vec!["--kubeconfig", self.kubeconfig.to_str().unwrap()];
        all.extend_from_slice(args);
        let out = kubenode::output(&self.kubectl, &all);
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    }

    /// `kubectl migdra ARGS`: kubectl finds this build's binary as `kubectl-migdra` on the PATH.
    fn kubectl_migdra(&self, args: &[&str]) -> String {
        let plugins = self.node_dir.join("kubectl-plugins");
        support::command::kubectl_plugin(&plugins);
        let path = format!("{}:{}", plugins.display(), std::env::var("PATH").unwrap_or_default());
        // kubectl takes no flags before a plugin's name; those after it are the plugin's own.
        let mut all = vec!["migdra"];
        all.extend_from_slice(args);
        all.extend(["--kubeconfig", self.kubeconfig.to_str().unwrap()]);
        let out = std::process::Command::new(&self.kubectl).args(&all).env("PATH", path).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "kubectl migdra {args:?}: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all)).unwrap()
    }

    fn helm(&self, args: &[&str]) -> String {
        let mut all = args.to_vec();
        all.extend(["--kubeconfig", self.kubeconfig.to_str().unwrap()]);
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = std::process::Command::new(&self.helm).args(&all).current_dir(repo).output().unwrap();
        assert!(out.status.success(), "helm {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `helm upgrade` of the installed release, its values kept but for `args`.
    fn upgrade(&self, args: &[&str]) {
        let mut all = vec!["upgrade", "migdra", "daemonset/helm/migdra", "-n", CHART_NS, "--reuse-values"];
        all.extend_from_slice(args);
        self.helm(&all);
    }

    /// `kubectl apply -f -` of a YAML text.
    fn apply(&self, namespace: &str, yaml: &str) {
        static APPLIED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = APPLIED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file = self.node_dir.join(format!("apply-{n}.yaml"));
        std::fs::write(&file, yaml).unwrap();
        self.kubectl(&["apply", "-n", namespace, "-f", file.to_str().unwrap()]);
    }

    /// `sh -c SCRIPT` in a pod's first container.
    fn exec(&self, namespace: &str, pod: &str, script: &str) -> String {
        self.kubectl(&["exec", "-n", namespace, pod, "--", "sh", "-c", script])
    }

    async fn wait_running(&self, namespace: &str, pod: &str) -> Duration {
        let t = Instant::now();
        eventually(format!("pod {namespace}/{pod} Running and Ready"))
            .within(Duration::from_secs(120))
            .every(Duration::from_millis(100))
            .explain(|| self.explain(namespace, pod))
            .until(|| {
                let (ok, out) = self.try_kubectl(&[
                    "get",
                    "pod",
                    "-n",
                    namespace,
                    pod,
                    "-o",
                    "jsonpath={.status.phase} {.status.conditions[?(@.type==\"Ready\")].status}",
                ]);
                if ok && out.trim() == "Running True" { Ok(()) } else { Err(out) }
            })
            .await;
        t.elapsed()
    }

    /// The pod's `NVIDIA_VISIBLE_DEVICES`, asked inside it until it answers with a device: after
    /// a restart of the runtime or the node the API's status lags behind the containers.
    async fn device_inside(&self, namespace: &str, pod: &str) -> String {
        eventually(format!("{pod} answering exec with its device"))
            .within(Duration::from_secs(180))
            .every(Duration::from_millis(500))
            .explain(|| self.explain(namespace, pod))
            .until(|| {
                let (ok, out) =
                    self.try_kubectl(&["exec", "-n", namespace, pod, "--", "sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"]);
                let out = out.trim().to_string();
                if ok && (out.starts_with("MIG-") || out.starts_with("GPU-")) { Ok(out) } else { Err(out) }
            })
            .await
    }

    /// Every FailedPrepareDynamicResources event: "pod: message".
    fn failed_prepares(&self) -> Vec<String> {
        self.kubectl(&[
            "get",
            "events",
            "-A",
            "--field-selector",
            "reason=FailedPrepareDynamicResources",
            "-o",
            "jsonpath={range .items[*]}{.involvedObject.name}: {.message}{\"\\n\"}{end}",
        ])
        .lines()
        .map(str::to_owned)
        .collect()
    }

    /// Waits until every migdra pod has been Ready for `steady` without a break.
    async fn steady_ready(&self, steady: Duration) {
        let mut since: Option<Instant> = None;
        eventually(format!("migdra's pods Ready for {steady:?} in a row"))
            .within(steady + Duration::from_secs(90))
            .every(Duration::from_secs(1))
            .explain(|| self.unhealthy())
            .until(|| {
                let (_, out) = self.try_kubectl(&[
                    "get",
                    "pods",
                    "-n",
                    CHART_NS,
                    "-o",
                    "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
                ]);
                let ready = !out.trim().is_empty() && out.split_whitespace().all(|s| s == "True");
                since = if ready { since.or_else(|| Some(Instant::now())) } else { None };
                since.is_some_and(|t| t.elapsed() >= steady)
            })
            .await;
    }

    /// The probe failures recorded in migdra's namespace, one per line.
    fn unhealthy(&self) -> String {
        let (_, out) = self.try_kubectl(&[
            "get",
            "events",
            "-n",
            CHART_NS,
            "--field-selector",
            "reason=Unhealthy",
            "-o",
            "jsonpath={range .items[*]}{.lastTimestamp} {.involvedObject.name}: {.message}{\"\\n\"}{end}",
        ]);
        if out.trim().is_empty() { "none".into() } else { out }
    }

    /// `kubectl rollout status` of migdra's DaemonSet, failing with what the pods said.
    fn rollout(&self) {
        let (ok, out) = self.try_kubectl(&["-n", CHART_NS, "rollout", "status", "daemonset/migdra", "--timeout=180s"]);
        assert!(ok, "rollout status: {out}\n{}", self.explain(CHART_NS, "-l app.kubernetes.io/name=migdra"));
    }

    /// The containers' own logs of a namespace, from the kubelet's pod log directory (also those
    /// of containers that exited).
    fn container_logs(&self, namespace: &str) -> String {
        let mut out = String::new();
        for log in log_files(&self.node_dir, namespace, None) {
            out.push_str(&support::logs::file_tail("container", &log, 15));
            out.push('\n');
        }
        out
    }

    fn explain(&self, namespace: &str, pod: &str) -> String {
        let mut describe_args = vec!["describe", "pod", "-n", namespace];
        describe_args.extend(pod.split_whitespace());
        let (_, describe) = self.try_kubectl(&describe_args);
        let (_, claims) = self.try_kubectl(&["get", "resourceclaims", "-A", "-o", "yaml"]);
        let (_, plugin) =
            self.try_kubectl(&["logs", "-n", CHART_NS, "-l", "app.kubernetes.io/name=migdra", "--tail=40"]);
        format!(
            "{}\n--- claims\n{}\n--- migdra\n{plugin}\n{}\n{}",
            support::logs::tail(&describe, 40),
            support::logs::tail(&claims, 60),
            self.container_logs(CHART_NS),
            support::logs::file_tail("kubelet", &self.node_dir.join("kubelet.log"), 40)
        )
    }

    /// The claim of a pod's one resource claim, as the API server has it.
    fn claim_of(&self, namespace: &str, pod: &str) -> Value {
        let p = self.json(&["get", "pod", "-n", namespace, pod]);
        let name = p["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
            .as_str()
            .unwrap_or_else(|| panic!("{pod} has no generated claim: {}", p["status"]))
            .to_string();
        self.json(&["get", "resourceclaim", "-n", namespace, &name])
    }
}

/// The MIG instances on the simulated GPUs: (GPU minor, profile ID, placement start).
fn instances(node: &KubeNode) -> Vec<Instance> {
    let state = node.sim_state();
    let out = support::command::migdra()
        .args(["layout", "-o", "json", "--sim-state"])
        .arg(&state)
        .output()
        .expect("run migdra layout");
    assert!(out.status.success(), "migdra layout: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut all = Vec::new();
    for g in v["gpus"].as_array().unwrap() {
        for i in g["instances"].as_array().unwrap() {
            all.push((
                g["minor"].as_u64().unwrap(),
                i["profile_id"].as_u64().unwrap(),
                i["placement"]["start"].as_u64().unwrap(),
            ));
        }
    }
    all
}

/// The CDI specs in the node's /var/run/cdi (inside its mount namespace).
fn cdi_specs(node: &KubeNode) -> Vec<String> {
    let out = node.in_node(Path::new("ls")).arg("/var/run/cdi").output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("mig.slinky.slurm.net"))
        .map(str::to_owned)
        .collect()
}

/// The device metadata directories migdra keeps on the host, one per prepared claim.
fn metadata_dirs(node: &KubeNode) -> Vec<String> {
    let dir = node.root_dir().join("plugins/mig.slinky.slurm.net/dra-device-metadata");
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The part of `text` from `from`, up to the end of its sentence or 160 characters.
fn excerpt(text: &str, from: &str) -> String {
    let start = text.find(from).unwrap_or(0);
    text[start..].chars().take(160).take_while(|&c| c != '\n').collect()
}

/// A pod from the workload image, its command `sleep` until deleted, with the given extra spec.
fn workload_pod(name: &str, claims: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n{claims}\
         \n  containers:\n  - name: main\n    image: {WORKLOAD_IMAGE}\n    resources:\n{resources}\n"
    )
}

/// SIGKILL the running migdra container's process, as a crash; false when none is running.
fn kill_migdra(node: &KubeNode) -> bool {
    let out = node.crictl(&["ps", "--name", "migdra", "-q"]);
    let Some(id) = String::from_utf8_lossy(&out.stdout).lines().next().map(str::to_owned) else { return false };
    let inspect: Value = serde_json::from_slice(&node.crictl(&["inspect", &id]).stdout).unwrap_or_default();
    let Some(pid) = inspect["info"]["pid"].as_u64() else { return false };
    std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().is_ok_and(|s| s.success())
}

/// `migdra sim fail FAULT` on the node's simulated GPUs, as the daemon sees them.
fn sim_fail(node: &KubeNode, fault: &str) {
    let out =
        support::command::migdra().args(["sim", "fail", fault, "--sim-state"]).arg(node.sim_state()).output().unwrap();
    assert!(out.status.success(), "migdra sim fail {fault}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A MIG instance: (GPU minor, profile ID, placement start).
type Instance = (u64, u64, u64);

/// A workload pod whose one claim `gpu` is made from the ResourceClaimTemplate `template`.
fn claim_pod(name: &str, template: &str) -> String {
    workload_pod(
        name,
        &format!("  resourceClaims:\n  - name: gpu\n    resourceClaimTemplateName: {template}"),
        "      claims: [{name: gpu}]",
    )
}

/// Everything on the node that says a claim is prepared: instances, CDI specs, metadata.
type Prepared = (Vec<Instance>, Vec<String>, Vec<String>);

/// Each list sorted: two reads compare equal whatever order NVML or the directory lists them in.
fn prepared(node: &KubeNode) -> Prepared {
    let (mut instances, mut specs, mut metadata) = (instances(node), cdi_specs(node), metadata_dirs(node));
    instances.sort_unstable();
    specs.sort_unstable();
    metadata.sort_unstable();
    (instances, specs, metadata)
}

/// A running single-node cluster with the chart installed and the node opted in.
struct Cluster {
    cp: ControlPlane,
    node: KubeNode,
    ops: Ops,
}

/// How a node's install differs from the default one: its simulated GPUs, more chart values
/// (YAML lines), `env` for the migdra container, and what to do before `helm install`.
struct Setup<'a> {
    gpus: &'a str,
    values: String,
    env: &'a [(&'a str, &'a str)],
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Self { gpus: GPUS, values: String::new(), env: &[] }
    }
}

/// Images, control plane, node, `helm install`, node label, rollout: daemonset/README.md's
/// commands, with the values this node needs: simulated GPUs, the kubelet's root dir, and the
/// API server's address for pods (no kube-proxy here), and `env` for the migdra container.
async fn bring_up(steps: &Steps, env: &[(&str, &str)]) -> Cluster {
    bring_up_with(steps, Setup { env, ..Setup::default() }).await
}

/// [`bring_up`] of a node set up as `setup` says.
async fn bring_up_with(steps: &Steps, setup: Setup<'_>) -> Cluster {
    let Setup { gpus, values: more_values, env } = setup;
    let helm = support::render::HELM.find().expect("helm: bash hack/build-helm.sh (MIGDRA_REQUIRE_RENDERS=1 in CI)");
    let images_dir = tempfile::tempdir().unwrap();
    let images = kubenode::image_archives(images_dir.path());
    steps.say("images: migdra's, pause and workload archives ready");

    let cp = ControlPlane::start_for_nodes(kubenode::release(), POD_GATEWAY).await;
    steps.say(&format!("control plane up: {}", cp.versions));
    let node = KubeNode::start(&cp, NODE_NAME, &images);
    for name in EXAMPLE_IMAGES {
        node.ctr(&["images", "tag", WORKLOAD_IMAGE, name]);
    }
    let ops = Ops::new(&node, cp.kubeconfig(), helm);
    let started = Instant::now();
    eventually("the Node Ready")
        .within(Duration::from_secs(60))
        .every(Duration::from_millis(100))
        .explain(|| node.log("kubelet"))
        .until(|| {
            let (ok, out) = ops.try_kubectl(&[
                "get",
                "node",
                NODE_NAME,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ]);
            ok && out.trim() == "True"
        })
        .await;
    steps.say(&format!(
        "node Ready: kubelet {} with containerd and runc, {:.1} s after the node's start",
        ops.kubectl(&["get", "node", NODE_NAME, "-o", "jsonpath={.status.nodeInfo.kubeletVersion}"]),
        (node.startup + started.elapsed()).as_secs_f64()
    ));

    let api_port = cp.url.rsplit(':').next().unwrap().to_string();
    let values = node.dir().join("values.yaml");
    let mut text = format!(
        "kubeletRootDir: {root}\nsimulation:\n  gpus: {gpus}\n  stateDir: {sim}\n{more_values}extraEnv:\n\
         - name: KUBERNETES_SERVICE_HOST\n  value: \"{POD_GATEWAY}\"\n\
         - name: KUBERNETES_SERVICE_PORT\n  value: \"{api_port}\"\n",
        root = node.root_dir().display(),
        sim = node.sim_dir().display(),
    );
    for (name, value) in env {
        text.push_str(&format!("- name: {name}\n  value: \"{value}\"\n"));
    }
    std::fs::write(&values, text).unwrap();
    let t = Instant::now();
    ops.helm(&[
        "install",
        "migdra",
        "daemonset/helm/migdra",
        "-n",
        CHART_NS,
        "--create-namespace",
        "-f",
        values.to_str().unwrap(),
    ]);
    ops.kubectl(&["label", "node", NODE_NAME, "mig.slinky.slurm.net/enabled=true"]);
    ops.rollout();
    let ds_ready = t.elapsed();
    steps.say(&format!(
        "DaemonSet Ready {:.1} s after helm install (exec probes, in-cluster auth)",
        ds_ready.as_secs_f64()
    ));

    // Ready means published: the slices are there once rollout status returns. Their node label
    // is the driver's domain, which `MIGDRA_DRIVER_NAME` may change.
    let driver = env.iter().find(|(k, _)| *k == "MIGDRA_DRIVER_NAME").map_or(support::DRIVER, |(_, v)| v);
    let slices = ops.json(&["get", "resourceslices", "-l", &format!("{driver}/node={NODE_NAME}")]);
    let devices: usize =
        slices["items"].as_array().unwrap().iter().map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len)).sum();
    assert!(devices > 0, "no devices published once the DaemonSet was Ready: {slices}");
    steps.say(&format!("{} ResourceSlices, {devices} devices", slices["items"].as_array().unwrap().len()));
    Cluster { cp, node, ops }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stdout, clippy::too_many_lines)] // the test's report; one scenario in steps
async fn the_chart_on_a_real_node() {
    let _serial = SERIAL.lock().await;
    let steps = Steps(Instant::now());
    let Cluster { cp, mut node, ops } = bring_up(&steps, &[]).await;

    // A plain pod and a MIG pod, created the same way, timed from creation to Running.
    ops.kubectl(&["create", "namespace", USERS]);
    let t = Instant::now();
    ops.apply(USERS, &workload_pod("plain", "", "      limits: {memory: 64Mi}"));
    let plain = ops.wait_running(USERS, "plain").await.max(t.elapsed());
    ops.kubectl(&["apply", "-n", USERS, "-k", "daemonset/examples"]);
    let t = Instant::now();
    let notebook = ops.wait_running(USERS, "notebook").await.max(t.elapsed());
    steps.say(&format!(
        "first MIG pod Running: notebook {:.2} s after creation; a pod without claims {:.2} s; ratio {:.1}",
        notebook.as_secs_f64(),
        plain.as_secs_f64(),
        notebook.as_secs_f64() / plain.as_secs_f64()
    ));

    // The notebook sees exactly its MIG device, and the metadata file says what it got.
    let claim = ops.claim_of(USERS, "notebook");
    let device = &claim["status"]["devices"][0];
    let mig_uuid = device["data"]["migUUID"].as_str().unwrap_or_else(|| panic!("no migUUID: {device}")).to_string();
    let inside = ops.exec(USERS, "notebook", "echo NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES; ls /dev");
    assert!(inside.contains(&format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}\n")), "{inside}");
    let gpus: Vec<&str> = inside
        .split_whitespace()
        .filter(|w| w.starts_with("nvidia") && w[6..].chars().all(|c| c.is_ascii_digit()) && w.len() > 6)
        .collect();
    assert_eq!(gpus.len(), 1, "exactly one GPU node in the notebook: {inside}");
    for n in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
        assert!(inside.split_whitespace().any(|w| w == n), "{n} missing in the notebook: {inside}");
    }
    let caps = ops.exec(USERS, "notebook", "ls /dev/nvidia-caps");
    assert_eq!(caps.split_whitespace().filter(|w| w.starts_with("nvidia-cap")).count(), 2, "two caps: {caps}");
    let metadata = ops.exec(
        USERS,
        "notebook",
        "cat /var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/*/*/\
         mig.slinky.slurm.net-metadata.json",
    );
    for want in [mig_uuid.as_str(), "slurmGpuIndex", "slurmShards"] {
        assert!(metadata.contains(want), "{want} not in the notebook's metadata file: {metadata}");
    }
    assert_eq!(instances(&node).len(), 1, "one instance for the notebook");
    steps.say(&format!("notebook: {mig_uuid}, its device nodes only, metadata with the Slurm index"));

    // A pod written for NVIDIA's device plugin: no claim, an extended resource (KEP-5004).
    ops.apply(USERS, &workload_pod("device-plugin-style", "", "      limits: {nvidia.com/mig-1g.10gb: 1}"));
    ops.wait_running(USERS, "device-plugin-style").await;
    let env = ops.exec(USERS, "device-plugin-style", "echo $NVIDIA_VISIBLE_DEVICES");
    assert!(env.trim().starts_with("MIG-"), "{env}");
    assert_eq!(instances(&node).len(), 2);
    steps.say(&format!("device-plugin pod (nvidia.com/mig-1g.10gb: 1): {}", env.trim()));

    // A whole GPU on the MIG-off A100.
    ops.apply(USERS, &claim_pod("trainer", "gpu-whole"));
    ops.wait_running(USERS, "trainer").await;
    let env = ops.exec(USERS, "trainer", "echo $NVIDIA_VISIBLE_DEVICES; ls /dev");
    assert!(env.starts_with("GPU-"), "{env}");
    steps.say(&format!("whole-GPU pod: {}", env.lines().next().unwrap_or("")));

    // The operator's view: `kubectl migdra`, found by the real kubectl as a plugin on the PATH.
    ops.kubectl(&["apply", "-n", USERS, "-k", "daemonset/examples/training"]);
    let usage = ops.kubectl_migdra(&["usage"]);
    for holder in [
        "team-a/notebook  claim notebook-gpu-",
        "team-a/device-plugin-style  claim device-plugin-style-",
        "team-a/trainer  claim trainer-gpu-",
    ] {
        assert!(usage.contains(holder), "{holder:?} not drawn:\n{usage}");
    }
    let why = eventually("the training pod explained as pending")
        .within(Duration::from_secs(30))
        .every(Duration::from_millis(250))
        .until(|| {
            let why = ops.kubectl_migdra(&["why", "training", "-n", USERS]);
            if why.contains("scheduler: ") { Ok(why) } else { Err(why) }
        })
        .await;
    assert!(why.contains("request mig: class mig-7g.80gb, 1 device; 1 matching device on 1 node"), "{why}");
    assert!(
        why.contains(
            ": full: 6 of 8 memory slices free, 8 needed; held by \
             team-a/device-plugin-style (claim device-plugin-style-"
        ),
        "{why}"
    );
    assert!(why.contains("team-a/notebook (claim notebook-gpu-"), "{why}");
    ops.kubectl(&["delete", "pod", "-n", USERS, "training", "--wait=true", "--timeout=90s"]);
    steps.say("kubectl migdra usage draws the three claims; why says who holds the H100 the training pod waits for");

    // Admin access: the monitoring example sees every instance of GPU 0 and creates none.
    let before = instances(&node).len();
    ops.kubectl(&["apply", "-k", "daemonset/examples/monitoring"]);
    let monitor = eventually("the monitoring DaemonSet's pod")
        .within(Duration::from_secs(60))
        .until(|| {
            let (ok, out) =
                ops.try_kubectl(&["get", "pods", "-n", "gpu-monitoring", "-o", "jsonpath={.items[0].metadata.name}"]);
            if ok && !out.trim().is_empty() { Ok(out.trim().to_string()) } else { Err(out) }
        })
        .await;
    ops.wait_running("gpu-monitoring", &monitor).await;
    let seen = ops.exec("gpu-monitoring", &monitor, "ls /dev/nvidia-caps; echo $NVIDIA_VISIBLE_DEVICES");
    assert_eq!(instances(&node).len(), before, "admin access creates no instance");
    steps.say(&format!("admin-access monitoring pod sees: {}", seen.split_whitespace().collect::<Vec<_>>().join(" ")));
    ops.kubectl(&["delete", "-k", "daemonset/examples/monitoring", "--wait=true", "--timeout=90s"]);

    // Each pod deleted: unprepared, instance gone, spec and metadata removed.
    for pod in ["device-plugin-style", "trainer"] {
        ops.kubectl(&["delete", "pod", "-n", USERS, pod, "--wait=true", "--timeout=90s"]);
    }
    eventually("only the notebook's claim left prepared")
        .within(Duration::from_secs(60))
        .explain(|| ops.explain(USERS, "notebook"))
        .until(|| {
            let p = prepared(&node);
            if p.0.len() == 1 && p.1.len() == 1 && p.2.len() == 1 { Ok(()) } else { Err(format!("{p:?}")) }
        })
        .await;
    steps.say("deleted pods: unprepared, their instances, specs and metadata gone");

    // Lifecycle: the migdra container killed; the kubelet restarts it and the notebook keeps its device.
    let ds_pod = ops.kubectl(&["get", "pods", "-n", CHART_NS, "-o", "jsonpath={.items[0].metadata.name}"]);
    let restarts = |ops: &Ops| {
        ops.kubectl(&[
            "get",
            "pod",
            "-n",
            CHART_NS,
            ds_pod.trim(),
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount}",
        ])
    };
    assert!(kill_migdra(&node), "no migdra container to kill: {}", ops.explain(CHART_NS, ds_pod.trim()));
    eventually("the migdra container restarted and Ready")
        .within(Duration::from_secs(90))
        .explain(|| ops.explain(CHART_NS, ds_pod.trim()))
        .until(|| {
            restarts(&ops).trim() == "1"
                && ops.try_kubectl(&["-n", CHART_NS, "rollout", "status", "daemonset/migdra", "--timeout=1s"]).0
        })
        .await;
    assert_eq!(instances(&node).len(), 1, "the notebook's instance survives the plugin's crash");
    steps.say("migdra container killed: restarted by the kubelet, Ready, the notebook's instance kept");

    // The kubelet restarted, then containerd: pods go on, the notebook keeps its device.
    node.restart_kubelet();
    assert_eq!(ops.device_inside(USERS, "notebook").await, mig_uuid);
    node.restart_containerd();
    assert_eq!(ops.device_inside(USERS, "notebook").await, mig_uuid);
    assert_eq!(instances(&node).len(), 1, "no instance made or lost by the restarts");
    steps.say("kubelet and containerd restarted: the notebook runs with its device");

    // helm upgrade rolls the DaemonSet (maxSurge: the new pod registers beside the old one) while
    // the notebook runs, and a pod created during the roll is prepared by whichever answers. The
    // DaemonSet controller deletes an old pod that is not Ready at once, without waiting for the
    // new one, and the restarts above can leave the pod's probes failing for a moment after
    // `rollout status` has passed (its exec probes run through containerd): so the roll starts
    // only after the pod has been Ready for three probe periods in a row.
    ops.rollout();
    ops.steady_ready(Duration::from_secs(15)).await;
    ops.upgrade(&["--set", "podAnnotations.rolled=once"]);
    ops.apply(USERS, &claim_pod("during-roll", "mig-1g-10gb"));
    ops.rollout();
    ops.wait_running(USERS, "during-roll").await;
    assert_eq!(ops.device_inside(USERS, "notebook").await, mig_uuid);
    assert_eq!(instances(&node).len(), 2, "the notebook's and the new pod's instances");
    steps.say("helm upgrade rolled the DaemonSet: the notebook kept its device, a pod created during the roll runs");

    // Ready means publishing: a roll to pods that cannot reach the API server (a wrong port)
    // never becomes Ready, the old pod keeps serving, and the probe says which address failed.
    let revision =
        ops.kubectl(&["get", "secret", "-n", CHART_NS, "-l", "owner=helm,name=migdra", "-o", "name"]).lines().count();
    let unreachable = node.dir().join("unreachable-values.yaml");
    std::fs::write(
        &unreachable,
        format!(
            "extraEnv:\n- name: KUBERNETES_SERVICE_HOST\n  value: \"{POD_GATEWAY}\"\n\
             - name: KUBERNETES_SERVICE_PORT\n  value: \"1\"\n"
        ),
    )
    .unwrap();
    ops.upgrade(&["-f", unreachable.to_str().unwrap()]);
    let (rolled, out) = ops.try_kubectl(&["-n", CHART_NS, "rollout", "status", "daemonset/migdra", "--timeout=25s"]);
    assert!(!rolled, "a DaemonSet that cannot publish rolled out: {out}");
    let probe = eventually("the readiness probe's failure on the new pod")
        .within(Duration::from_secs(30))
        .until(|| {
            let out = ops.unhealthy();
            if out.contains(&format!("{POD_GATEWAY}:1")) { Ok(out) } else { Err(out) }
        })
        .await;
    assert_eq!(ops.device_inside(USERS, "notebook").await, mig_uuid);
    ops.helm(&["rollback", "migdra", &revision.to_string(), "-n", CHART_NS]);
    ops.rollout();
    steps.say(&format!(
        "a roll that cannot reach the API server stays unready ({}); rolled back",
        excerpt(&probe, "publishing ResourceSlices to")
    ));

    let failed = ops.failed_prepares();
    assert!(
        failed.is_empty(),
        "no prepare failed before the reboot: {failed:?}\nmigdra's probe failures: {}",
        ops.unhealthy()
    );

    // A node reboot: every process gone, /run (CDI specs, containerd's state) gone, the simulated
    // GPUs rebooted (no instances, a new boot ID). The pods come back with their claims prepared
    // again.
    let sim_state = node.sim_state();
    node.reboot(|| {
        let out = support::command::migdra().args(["sim", "reboot", "--sim-state"]).arg(&sim_state).output().unwrap();
        assert!(out.status.success(), "migdra sim reboot: {}", String::from_utf8_lossy(&out.stderr));
    });
    for pod in ["notebook", "during-roll"] {
        assert!(ops.device_inside(USERS, pod).await.starts_with("MIG-"));
    }
    eventually("both claims' instances re-created after the reboot")
        .within(Duration::from_secs(60))
        .until(|| {
            let p = prepared(&node);
            if p.0.len() == 2 && p.1.len() == 2 { Ok(()) } else { Err(format!("{p:?}")) }
        })
        .await;
    steps.say("node rebooted: pods back, claims prepared again on the new boot");

    // No prepare failed anywhere in the lifecycle (none before the reboot, checked above). After
    // the reboot the kubelet starts the pods before migdra's pod has registered and says so, or,
    // when the plugin watcher sees migdra's registration socket re-created at the path of its
    // pre-reboot registration, unregisters that one (closing the connection under the prepares
    // it just sent: "the client connection is closing") and registers the new: the kubelet's
    // order of start, and it retries (seen in its log: UnregisterPlugin of the socket with a zero
    // timestamp, RegisterPlugin a second later). Any other failure is migdra's.
    let failed = ops.failed_prepares();
    let kubelets = |m: &str| m.ends_with("is not registered") || m.ends_with("grpc: the client connection is closing");
    let waited = failed.iter().filter(|m| kubelets(m)).count();
    let others: Vec<&String> = failed.iter().filter(|m| !kubelets(m)).collect();
    assert!(others.is_empty(), "failed prepares: {others:?}");
    steps
        .say(&format!("no prepare failed; {waited} kubelet retries waited for migdra's registration after the reboot"));

    // Bad input on a real node: the driver's control node is missing. The prepare fails in one
    // line naming it, shown on the pod, and leaves nothing; once the node is back, the kubelet's
    // retry succeeds.
    let before = prepared(&node);
    let rm = node.in_node(Path::new("rm")).arg("/dev/nvidiactl").status().unwrap();
    assert!(rm.success(), "rm /dev/nvidiactl in the node");
    ops.apply(USERS, &claim_pod("no-driver", "mig-1g-10gb"));
    let why = eventually("the failed prepare on the pod")
        .within(Duration::from_secs(60))
        .every(Duration::from_millis(200))
        .explain(|| ops.explain(USERS, "no-driver"))
        .until(|| {
            let (_, out) = ops.try_kubectl(&[
                "get",
                "events",
                "-n",
                USERS,
                "--field-selector",
                "involvedObject.name=no-driver,reason=FailedPrepareDynamicResources",
                "-o",
                "jsonpath={.items[*].message}",
            ]);
            if out.contains("dev/nvidiactl does not exist") { Ok(out) } else { Err(out) }
        })
        .await;
    assert_eq!(prepared(&node), before, "a failed prepare leaves nothing behind");
    let phase = ops.kubectl(&["get", "pod", "-n", USERS, "no-driver", "-o", "jsonpath={.status.phase}"]);
    assert_eq!(phase, "Pending", "{why}");
    let mknod =
        node.in_node(Path::new("mknod")).args(["-m", "0666", "/dev/nvidiactl", "c", "195", "255"]).status().unwrap();
    assert!(mknod.success());
    ops.wait_running(USERS, "no-driver").await;
    ops.kubectl(&["delete", "pod", "-n", USERS, "no-driver", "--wait=true", "--timeout=90s"]);
    steps.say(&format!(
        "missing /dev/nvidiactl: the prepare failed in one line on the pod ({}), nothing left; the \
         retry ran once it was back",
        excerpt(&why, "dev/nvidiactl")
    ));

    // Drain: every pod evicted but the DaemonSet's, every instance destroyed.
    ops.kubectl(&["drain", NODE_NAME, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=120s"]);
    eventually("nothing prepared after the drain")
        .within(Duration::from_secs(60))
        .until(|| {
            let p = prepared(&node);
            if p.0.is_empty() && p.1.is_empty() && p.2.is_empty() { Ok(()) } else { Err(format!("{p:?}")) }
        })
        .await;
    ops.kubectl(&["uncordon", NODE_NAME]);
    steps.say("drained: every instance, spec and metadata file gone");

    drop(node);
    drop(cp);
    let left = kubenode::leftovers();
    assert!(left.is_empty(), "the node left behind: {left:?}");
    steps.say("node torn down: no cgroups, no bridge, no mounts left");
}

/// `hack/node-up.sh`: the cluster of the test above, left running for a person with kubectl
/// until `hack/node-down.sh` asks it to stop (the file `stop` in `$MIGDRA_NODE_UP_DIR`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "brings a node up for hack/node-up.sh and waits for hack/node-down.sh; not a test"]
#[allow(clippy::print_stdout)] // what a person needs to use it
async fn node_up() {
    let dir = PathBuf::from(std::env::var_os("MIGDRA_NODE_UP_DIR").expect("MIGDRA_NODE_UP_DIR: run hack/node-up.sh"));
    let steps = Steps(Instant::now());
    let Cluster { cp, node, ops } = bring_up(&steps, &[]).await;
    ops.kubectl(&["create", "namespace", USERS]);
    std::fs::copy(cp.kubeconfig(), dir.join("kubeconfig")).unwrap();
    std::fs::write(dir.join("kubectl"), ops.kubectl.display().to_string()).unwrap();
    std::fs::write(dir.join("node-dir"), node.dir().display().to_string()).unwrap();
    std::fs::write(dir.join("up"), "").unwrap();
    steps.say("up; hack/node-down.sh stops it");
    while !dir.join("stop").exists() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    drop(node);
    drop(cp);
    let left = kubenode::leftovers();
    assert!(left.is_empty(), "the node left behind: {left:?}");
    steps.say("down");
}

/// The chaos run's namespace, apart from the scenario's.
const CHAOS_NS: &str = "chaos";
/// A pod bound to the node but not Running after this long is stuck (the kubelet's restart
/// back-off after a container kill is 10 s, then 20 s).
const STUCK_AFTER: Duration = Duration::from_secs(90);

/// What the chaos run counted; every loss column must stay zero.
#[derive(Debug, Default)]
struct Chaos {
    cycles: usize,
    created: usize,
    deleted: usize,
    /// Pods seen Running and checked from inside.
    checked: usize,
    kills: usize,
    rolls: usize,
    kubelet_restarts: usize,
    faults: usize,
    /// Instances, specs or metadata without a running pod, at a quiet point.
    leaked: usize,
    /// Running pods whose device another running pod also has, or that saw another device.
    double: usize,
    /// Pods bound for [`STUCK_AFTER`] without running.
    stuck: usize,
}

/// One pod of the chaos run.
struct Tracked {
    name: String,
    created: Instant,
    checked: bool,
    deleted: bool,
    /// Its MIG UUID once checked.
    uuid: Option<String>,
}

/// A pod's state in one listing: (bound, running and ready, terminating).
fn pod_states(ops: &Ops) -> std::collections::HashMap<String, (bool, bool, bool)> {
    let v = ops.json(&["get", "pods", "-n", CHAOS_NS]);
    let mut out = std::collections::HashMap::new();
    for p in v["items"].as_array().into_iter().flatten() {
        let ready = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        out.insert(
            p["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            (
                p["spec"]["nodeName"].is_string(),
                p["status"]["phase"] == "Running" && ready,
                p["metadata"]["deletionTimestamp"].is_string(),
            ),
        );
    }
    out
}

/// `migdra.chaos` counts from the environment: `MIGDRA_CHAOS_CYCLES` (default 40, the short run
/// CI makes) and `MIGDRA_CHAOS_SEED`.
fn chaos_setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a number")))
}

/// Chaos on the real node: MIG pods of mixed profiles created and deleted without pause while
/// the migdra container is killed, the DaemonSet rolled twice, the kubelet restarted and NVML
/// faults injected. Every pod that runs is checked from inside; at a quiet point halfway and at
/// the end, nothing is held that no running pod explains. The counts are the chaos row of
/// docs/reliability.md (`MIGDRA_CHAOS_CYCLES=300`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stdout, clippy::too_many_lines)] // the run's report; one run in phases
async fn chaos_on_a_real_node() {
    use migdra::packing::allocator::Rng;
    let _serial = SERIAL.lock().await;
    let steps = Steps(Instant::now());
    let Cluster { cp, mut node, ops } = bring_up(&steps, &[]).await;
    let cycles = chaos_setting("MIGDRA_CHAOS_CYCLES", 40) as usize;
    let seed = chaos_setting("MIGDRA_CHAOS_SEED", 1);
    let mut rng = Rng::new(seed);
    ops.kubectl(&["create", "namespace", CHAOS_NS]);
    ops.kubectl(&["apply", "-n", CHAOS_NS, "-f", "daemonset/examples/claim-templates.yaml"]);
    // Profiles that always fit beside two others on the one H100 (7 × 1g, 3 × 2g placements).
    let templates = ["mig-1g-10gb", "mig-2g-20gb"];
    // The schedule: kills, two rolls, a kubelet restart, faults; at fixed points from the seed.
    let mut at = |from: usize| from + rng.below((cycles / 4).max(1));
    let kills = [at(2), at(cycles / 4), at(cycles / 2 + 1)];
    let rolls = [cycles / 3, 2 * cycles / 3];
    let kubelet_restart = cycles / 2 + 2;
    let faults = [at(1), at(cycles / 4), at(cycles / 2), at(3 * cycles / 4 - 1)];
    let mut rng = Rng::new(seed ^ 0x5eed);

    let mut c = Chaos { cycles, ..Chaos::default() };
    let mut pods: Vec<Tracked> = Vec::new();
    let mut next = 0;
    for cycle in 0..cycles {
        // The user: create a pod while fewer than three are alive; else mostly delete one that
        // ran, sometimes one still starting (its prepare may be in flight), or wait.
        let alive: Vec<usize> = (0..pods.len()).filter(|&i| !pods[i].deleted).collect();
        let ran: Vec<usize> = alive.iter().copied().filter(|&i| pods[i].checked).collect();
        let delete = if alive.len() < 3 && (alive.is_empty() || rng.below(3) > 0) {
            let name = format!("c{next}");
            next += 1;
            ops.apply(CHAOS_NS, &claim_pod(&name, templates[rng.below(templates.len())]));
            pods.push(Tracked { name, created: Instant::now(), checked: false, deleted: false, uuid: None });
            c.created += 1;
            None
        } else if !ran.is_empty() && rng.below(5) > 0 {
            Some(ran[rng.below(ran.len())])
        } else if rng.below(4) == 0 {
            Some(alive[rng.below(alive.len())])
        } else {
            None
        };
        if let Some(i) = delete {
            ops.kubectl(&["delete", "pod", "-n", CHAOS_NS, &pods[i].name, "--wait=false"]);
            pods[i].deleted = true;
            c.deleted += 1;
        }
        // The bad day.
        if kills.contains(&cycle) && kill_migdra(&node) {
            c.kills += 1;
        }
        if rolls.contains(&cycle) {
            ops.upgrade(&["--set", &format!("podAnnotations.chaos=roll-{cycle}")]);
            c.rolls += 1;
        }
        if cycle == kubelet_restart {
            node.restart_kubelet();
            c.kubelet_restarts += 1;
        }
        if faults.contains(&cycle) {
            sim_fail(
                &node,
                if c.faults.is_multiple_of(2) { "create-gi=insufficient-resources:1" } else { "destroy-gi=in-use:1" },
            );
            c.faults += 1;
        }
        // Watch every pod: check the ones that started, count the ones stuck.
        observe(&ops, &mut pods, &mut c);
        tokio::time::sleep(Duration::from_millis(700)).await;
        if cycle == cycles / 2 {
            quiet_point(&ops, &node, &mut pods, &mut c, "halfway").await;
            steps.say(&format!("chaos halfway: {c:?}"));
        }
    }
    for p in pods.iter_mut().filter(|p| !p.deleted) {
        ops.kubectl(&["delete", "pod", "-n", CHAOS_NS, &p.name, "--wait=false"]);
        p.deleted = true;
        c.deleted += 1;
    }
    quiet_point(&ops, &node, &mut pods, &mut c, "the end").await;
    steps.say(&format!(
        "chaos (seed {seed}): cycles {} pods {} checked {} kills {} rolls {} kubelet restarts {} \
         faults {} | leaked {} double {} stuck {}",
        c.cycles, c.created, c.checked, c.kills, c.rolls, c.kubelet_restarts, c.faults, c.leaked, c.double, c.stuck
    ));
    assert_eq!((c.leaked, c.double, c.stuck), (0, 0, 0), "{c:?}");
    assert!(
        c.kills >= 2 && c.rolls == 2 && c.kubelet_restarts == 1 && c.faults >= 3,
        "the chaos did not happen: {c:?}"
    );
    // Pods deleted before they ran are part of the chaos; most of the rest must have run.
    assert!(c.checked >= 3 && c.checked * 3 >= c.created, "too few pods were seen running: {c:?}");
    let left: Vec<String> = ops.failed_prepares().into_iter().filter(|m| m.starts_with('c')).collect();
    println!("failed prepares the kubelet retried: {}", left.len());
    drop(node);
    drop(cp);
}

/// Check each pod that runs now and was not checked: it sees exactly one GPU, its claim's MIG
/// UUID, and no other running pod has that UUID. Count pods bound too long without running.
#[allow(clippy::print_stdout)] // what went wrong, for the run's report
fn observe(ops: &Ops, pods: &mut [Tracked], c: &mut Chaos) {
    let states = pod_states(ops);
    for i in 0..pods.len() {
        let p = &pods[i];
        let Some(&(bound, running, terminating)) = states.get(&p.name) else { continue };
        if p.deleted || terminating {
            continue;
        }
        if running && !p.checked {
            let claim = ops.claim_of(CHAOS_NS, &p.name);
            let want = claim["status"]["devices"][0]["data"]["migUUID"].as_str().unwrap_or_default().to_string();
            let (ok, inside) = ops.try_kubectl(&[
                "exec",
                "-n",
                CHAOS_NS,
                &p.name,
                "--",
                "sh",
                "-c",
                "echo $NVIDIA_VISIBLE_DEVICES; ls /dev | grep -c '^nvidia[0-9][0-9]*$'",
            ]);
            if !ok {
                continue; // not answering yet (a restart in progress): next round
            }
            let mut lines = inside.lines();
            let (seen, gpus) = (lines.next().unwrap_or_default().trim(), lines.next().unwrap_or_default().trim());
            let taken = pods.iter().any(|o| o.name != p.name && !o.deleted && o.uuid.as_deref() == Some(seen));
            if want.is_empty() || seen != want || gpus != "1" || taken {
                println!(
                    "{}: saw {seen:?} ({gpus} GPU nodes), its claim says {want:?}, taken by another: {taken}",
                    p.name
                );
                c.double += 1;
            }
            pods[i].checked = true;
            pods[i].uuid = Some(seen.to_string());
            c.checked += 1;
        } else if bound && !running && !p.checked && p.created.elapsed() > STUCK_AFTER {
            println!(
                "{} stuck: bound, not running after {:?}\n{}",
                p.name,
                p.created.elapsed(),
                ops.explain(CHAOS_NS, &p.name)
            );
            c.stuck += 1;
            pods[i].checked = true; // counted once
        }
    }
}

/// Wait until every pod left runs (checked) and every deleted one is gone, then compare what the
/// node holds with the running pods: each holds one instance, one spec, one metadata directory.
#[allow(clippy::print_stdout)] // what went wrong, for the run's report
async fn quiet_point(ops: &Ops, node: &KubeNode, pods: &mut [Tracked], c: &mut Chaos, when: &str) {
    let quiet = eventually(format!("the chaos pods settled ({when})"))
        .within(STUCK_AFTER + Duration::from_secs(60))
        .every(Duration::from_millis(500))
        .explain(|| ops.explain(CHAOS_NS, "-l none-such"))
        .until(|| {
            let states = pod_states(ops);
            let gone = pods.iter().filter(|p| p.deleted).all(|p| !states.contains_key(&p.name));
            let settled = pods.iter().filter(|p| !p.deleted).all(|p| states.get(&p.name).is_some_and(|s| s.1));
            if gone && settled { Ok(()) } else { Err(format!("{states:?}")) }
        });
    quiet.await;
    observe(ops, pods, c);
    let running = pods.iter().filter(|p| !p.deleted).count();
    // Unprepares finish after the pods are gone: give them a minute, then count what is left.
    eventually(format!("the node holds what {running} running pods explain ({when})"))
        .within(Duration::from_secs(60))
        .every(Duration::from_millis(500))
        .measure(|| {
            let p = prepared(node);
            (p.0.len(), p.1.len(), p.2.len()) == (running, running, running)
        })
        .await;
    let p = prepared(node);
    let extra = |n: usize| n.saturating_sub(running);
    let leaked = extra(p.0.len()) + extra(p.1.len()) + extra(p.2.len());
    let missing = running.saturating_sub(p.0.len().min(p.1.len()).min(p.2.len()));
    if leaked + missing > 0 {
        println!("{when}: {running} running pods, the node holds {p:?}");
    }
    c.leaked += leaked + missing;
}

/// The namespace of the claims left mid-prepare, apart from the others.
const LEFT_NS: &str = "left";

/// The claims in migdra's checkpoint on the host, read as an operator would: (UID, state).
fn checkpoint(node: &KubeNode) -> Vec<(String, String)> {
    let out = support::command::migdra()
        .args(["claims", "-o", "json", "--plugin-dir"])
        .arg(node.root_dir().join("plugins/mig.slinky.slurm.net"))
        .output()
        .expect("run migdra claims");
    assert!(out.status.success(), "migdra claims: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .into_iter()
        .flatten()
        .map(|c| (c["uid"].as_str().unwrap_or_default().to_owned(), c["state"].as_str().unwrap_or_default().to_owned()))
        .collect()
}

/// The log files the kubelet keeps of a namespace's containers (those that exited too), or of
/// one container name only.
fn log_files(node_dir: &Path, namespace: &str, container: Option<&str>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for pod in std::fs::read_dir(node_dir.join("pod-logs")).into_iter().flatten().flatten() {
        if !pod.file_name().to_string_lossy().starts_with(&format!("{namespace}_")) {
            continue;
        }
        for c in std::fs::read_dir(pod.path()).into_iter().flatten().flatten() {
            if container.is_none_or(|name| c.file_name() == name) {
                out.extend(std::fs::read_dir(c.path()).into_iter().flatten().flatten().map(|l| l.path()));
            }
        }
    }
    out
}

/// The whole text of the migdra containers' logs on the node, those that exited included.
fn migdra_log(node: &KubeNode) -> String {
    log_files(&node.dir(), CHART_NS, Some("migdra"))
        .iter()
        .map(|l| std::fs::read_to_string(l).unwrap_or_default())
        .collect()
}

/// A claim left mid-prepare whose pod is deleted before the kubelet retries, on the real node.
/// migdra is killed while NVML creates the claim's compute instance (a simulated delay), so its
/// checkpoint holds the claim `PrepareStarted` with a GPU instance; then the pod is force-deleted.
/// - With the kubelet's state intact, either side may end it: the kubelet checkpoints a claim
///   before it asks the driver to prepare it, and unprepares the claims of pods that are gone.
/// - With the kubelet's claim checkpoint (`dra_manager_state`) lost while it was down, as on a
///   node whose kubelet directory was wiped, nothing in the kubelet remembers the claim: only
///   migdra's stale-claim check (every `--resync`, 5 s here) can release the instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stdout)] // the test's report
async fn a_claim_left_mid_prepare_on_a_real_node() {
    let _serial = SERIAL.lock().await;
    let steps = Steps(Instant::now());
    let Cluster { cp, mut node, ops } = bring_up(&steps, &[("MIGDRA_RESYNC", "5s")]).await;
    ops.kubectl(&["create", "namespace", LEFT_NS]);
    ops.kubectl(&["apply", "-n", LEFT_NS, "-f", "daemonset/examples/claim-templates.yaml"]);
    let held = |node: &KubeNode| {
        let (instances, specs, metadata) = prepared(node);
        (instances.len(), specs.len(), metadata.len(), checkpoint(node).len())
    };
    for (pod, kubelet_state_lost) in [("left-1", false), ("left-2", true)] {
        sim_fail(&node, "create-ci=delay:5m:1");
        ops.apply(LEFT_NS, &claim_pod(pod, "mig-1g-10gb"));
        let uid = eventually(format!("{pod}'s claim PrepareStarted with its GPU instance made"))
            .within(Duration::from_secs(60))
            .explain(|| ops.explain(LEFT_NS, pod))
            .until(|| {
                let cp = checkpoint(&node);
                match cp.as_slice() {
                    [(uid, state)] if state == "PrepareStarted" && instances(&node).len() == 1 => Ok(uid.clone()),
                    _ => Err(format!("checkpoint {cp:?}, instances {:?}", instances(&node))),
                }
            })
            .await;
        if kubelet_state_lost {
            node.stop_kubelet();
        }
        assert!(kill_migdra(&node), "no migdra container to kill");
        ops.kubectl(&["delete", "pod", "-n", LEFT_NS, pod, "--force", "--grace-period=0"]);
        if kubelet_state_lost {
            let state = node.root_dir().join("dra_manager_state");
            std::fs::remove_file(&state).unwrap_or_else(|e| panic!("{}: {e}", state.display()));
            node.start_kubelet();
        }
        let t = Instant::now();
        eventually(format!("{pod}'s instance released, nothing held"))
            .within(Duration::from_secs(120))
            .every(Duration::from_millis(500))
            .explain(|| format!("{:?}, checkpoint {:?}\n{}", prepared(&node), checkpoint(&node), node.log("kubelet")))
            .until(|| held(&node) == (0, 0, 0, 0))
            .await;
        let by_migdra = migdra_log(&node)
            .lines()
            .any(|l| l.contains("claim left mid-prepare is no longer allocated") && l.contains(&uid));
        steps.say(&format!(
            "{pod}: killed mid-prepare, pod deleted{}; released {:.1} s later by {}",
            if kubelet_state_lost { ", the kubelet's claim checkpoint lost" } else { "" },
            t.elapsed().as_secs_f64(),
            if by_migdra { "migdra's stale-claim check" } else { "the kubelet's unprepare" },
        ));
        if kubelet_state_lost {
            assert!(by_migdra, "released, but not by the stale-claim check: {}", migdra_log(&node));
        }
        ops.rollout();
    }
    drop(node);
    drop(cp);
    let left = kubenode::leftovers();
    assert!(left.is_empty(), "the node left behind: {left:?}");
}
