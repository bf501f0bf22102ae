//! The real slurm-bridge beside migdra on the real node: what the bridge at `6f700ba` does with
//! migdra's devices today (docs/bridge-contract.md, "What the bridge does today"), pinned so that
//! a newer bridge that changes it is noticed, and what the bridge does with migdra's patch series
//! (hack/slurm-bridge/patches):
//!
//! 1. a pod asking `nvidia.com/mig-1g.10gb` as NVIDIA's device plugin names it becomes an
//!    exclusive external job holding the whole Slurm node, with no claim, and its container
//!    starts without a GPU;
//!    with a shard annotation Slurm books a shard that nobody reads, and still no GPU;
//! 2. with `DynamicResources` added to the bridge's scheduler profile and a shard annotation, the
//!    pod runs on a MIG instance of another GPU than the one Slurm booked: on the GPU a native
//!    Slurm job holds whole;
//! 3. whole GPUs the bridge's own way (driver `gpu.nvidia.com`, Slurm index k → the device named
//!    `gpu-k`): a native Slurm job gets the very GPU the pod holds when slurmd's order is not the
//!    minor order; with migdra's patch series (hack/slurm-bridge/patches) the device's
//!    `slurmGpuIndex` wins, and the pod gets the GPU Slurm booked;
//! 4. with the patch series, MIG pods asking `nvidia.com/mig-<profile>` get shards on one GPU in
//!    Slurm and a partition on exactly that GPU in Kubernetes, beside a native job on the other.
//!
//! Slurm 26.05 runs beside the node with JWT as the bridge's client needs it, configured from
//! `migdra slurm-conf` for the node's simulated GPUs; the bridge's three binaries run as
//! `support::bridge` says.

use super::*;
use support::bridge::{self, Bridge, Profile, Variant};

#[path = "shared_node.rs"]
mod shared_node;
use support::slurm::{self, Slurm};

/// The namespace the bridge manages (its webhook sets the bridge's scheduler on its pods).
const MANAGED: &str = "bridged";

/// A node with Slurm and the bridge beside it.
/// Fields drop in order: the bridge stops before the cluster it schedules for, Slurm after it.
struct Hybrid {
    bridge: Bridge,
    cluster: Cluster,
    slurm: Slurm,
    _dir: tempfile::TempDir,
}

/// Slurm for the node's `gpus` as `migdra slurm-conf` configures it (`gres_type` for every GPU,
/// else the model's), the chart reading that configuration, and the bridge's `variant`; `None`
/// when Slurm or the bridge cannot run here (skipped, or failed under `MIGDRA_REQUIRE_*`).
async fn hybrid(
    steps: &Steps,
    variant: Variant,
    gpus: &str,
    gres_type: Option<&str>,
    env: &[(&str, &str)],
) -> Option<Hybrid> {
    if !slurm::required() || !slurm::has_bridge_api() {
        return None;
    }
    let bin = bridge::bin_dir(variant)?;
    let dir = tempfile::Builder::new().prefix("migdra-bridge-").tempdir().unwrap();
    let slurm_dir = dir.path().join("slurm");
    std::fs::create_dir_all(&slurm_dir).unwrap();
    let mut conf = support::command::migdra();
    conf.args(["slurm-conf", "-o", "json", "--sim", gpus, "--slurmd", "none", "--slurm-node-name", &slurm::host()])
        .arg("--dev-root")
        .arg(dir.path().join("dev"))
        .arg("--slurm-conf")
        .arg(slurm_dir.join("slurm.conf"));
    if let Some(t) = gres_type {
        conf.args(["--gres-type", t]);
    }
    let out = conf.output().unwrap();
    assert!(out.status.success(), "migdra slurm-conf: {}", String::from_utf8_lossy(&out.stderr));
    let conf: Value = serde_json::from_slice(&out.stdout).unwrap();
    let slurm = slurm::from_slurm_conf(&slurm_dir, &conf);
    steps.say(&format!("Slurm {} with JWT, slurmrestd on TCP; Gres={}", slurm::version(), conf["gres"]));

    // migdra reads that configuration (/etc/slurm in its pod) for the Slurm node of this host.
    let values = format!("slurmConfDir: {}\n", slurm_dir.display());
    let host = slurm::host();
    let mut env = env.to_vec();
    env.push(("MIGDRA_SLURM_NODE_NAME", &host));
    let cluster = bring_up_with(steps, Setup { gpus, values, env: &env }).await;
    // The bridge finds the Slurm node of a Kubernetes node by this label, else by the same name.
    cluster.ops.kubectl(&["label", "node", NODE_NAME, &format!("{}={}", bridge::SLURM_NODE_LABEL, slurm::host())]);
    cluster.ops.kubectl(&["create", "namespace", MANAGED]);
    let bridge = Bridge::start(
        &dir.path().join("bridge"),
        &bin,
        &cluster.ops.kubectl,
        &cluster.ops.kubeconfig,
        &slurm,
        MANAGED,
        Profile::Chart,
    );
    // The controllers taint every node they bridge; a pod created before that is placed without it.
    eventually("the bridge's controllers to taint the node")
        .within(Duration::from_secs(60))
        .every(Duration::from_millis(200))
        .explain(|| bridge.log("controllers"))
        .until(|| {
            let taints = cluster.ops.kubectl(&["get", "node", NODE_NAME, "-o", "jsonpath={.spec.taints}"]);
            if taints.contains(bridge::MANAGED_NODE_TAINT) { Ok(()) } else { Err(taints) }
        })
        .await;
    steps.say(&format!(
        "slurm-bridge ({variant:?}, {}) up: scheduler, controllers, admission; node tainted",
        bin.display()
    ));
    Some(Hybrid { bridge, cluster, slurm, _dir: dir })
}

/// A pod of the workload image in the managed namespace: `limits` (YAML flow map) and annotations.
fn bridged_pod(name: &str, limits: &str, annotations: &[(&str, &str)]) -> String {
    let mut meta = String::new();
    if !annotations.is_empty() {
        meta.push_str("\n  annotations:");
        for (k, v) in annotations {
            meta.push_str(&format!("\n    {k}: \"{v}\""));
        }
    }
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}{meta}\nspec:\n  terminationGracePeriodSeconds: 1\n\
         \x20 containers:\n  - name: main\n    image: {WORKLOAD_IMAGE}\n    resources:\n      limits: {limits}\n"
    )
}

impl Hybrid {
    /// The Slurm job the bridge made for a pod (its label), once the pod carries it.
    async fn job_of(&self, pod: &str) -> String {
        let ops = &self.cluster.ops;
        eventually(format!("{pod} to carry its Slurm job"))
            .within(Duration::from_secs(60))
            .every(Duration::from_millis(200))
            .explain(|| format!("{}\n{}", ops.explain(MANAGED, pod), self.bridge.log("scheduler")))
            .until(|| {
                let p = ops.json(&["get", "pod", "-n", MANAGED, pod]);
                p["metadata"]["labels"][bridge::JOB_LABEL]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| p["metadata"].to_string())
            })
            .await
    }

    /// The pod's ResourceClaims: every `resourceClaimStatuses` name and its extended-resource claim.
    fn claims_of(&self, pod: &str) -> Vec<String> {
        let p = self.cluster.ops.json(&["get", "pod", "-n", MANAGED, pod]);
        let mut names: Vec<String> = p["status"]["resourceClaimStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["resourceClaimName"].as_str().map(str::to_owned))
            .collect();
        if let Some(n) = p["status"]["extendedResourceClaimStatus"]["resourceClaimName"].as_str() {
            names.push(n.to_owned());
        }
        names
    }

    /// The pod's one claim and the status entry of migdra's device in it.
    fn prepared_claim(&self, pod: &str) -> (Value, Value) {
        let claims = self.claims_of(pod);
        let [claim] = &claims[..] else { panic!("{pod} has claims {claims:?}, expected its extended-resource claim") };
        let claim = self.cluster.ops.json(&["get", "resourceclaim", "-n", MANAGED, claim]);
        let status = claim["status"]["devices"]
            .as_array()
            .and_then(|d| d.iter().find(|d| d["driver"] == support::DRIVER))
            .unwrap_or_else(|| panic!("no status of migdra's device in {}", claim["status"]))
            .clone();
        (claim, status)
    }

    /// `scontrol show node`'s `KEY=` value for the Slurm node.
    fn node_field(&self, key: &str) -> String {
        slurm::field(&self.slurm.scontrol(&["show", "node", &slurm::host()]), key).to_string()
    }

    /// Delete a managed pod and wait until the bridge has ended its job.
    async fn end(&self, pod: &str, job: &str) {
        self.cluster.ops.kubectl(&["delete", "pod", "-n", MANAGED, pod, "--wait=true", "--timeout=120s"]);
        self.job_ends(job, &format!("job {job} of {pod} ended by the bridge")).await;
    }

    /// Wait until a Slurm job is neither running nor pending.
    async fn job_ends(&self, job: &str, what: &str) {
        eventually(what)
            .within(Duration::from_secs(90))
            .every(Duration::from_millis(500))
            .explain(|| self.bridge.log("controllers"))
            .until(|| {
                let state = self.slurm.job_state(job);
                if matches!(state.as_str(), "RUNNING" | "PENDING" | "COMPLETING") { Err(state) } else { Ok(()) }
            })
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stdout, clippy::too_many_lines)] // the test's report; one scenario in steps
async fn the_real_slurm_bridge_with_mig_today() {
    let _serial = SERIAL.lock().await;
    let steps = Steps(Instant::now());
    // Two H100s: NVML index 0 is minor 1, so Slurm's order (NVML's) is not the names' order.
    let Some(mut h) = hybrid(&steps, Variant::Unchanged, "h100-80gb:2", None, &[]).await else { return };
    let ops = &h.cluster.ops;

    // 1. As migdra's docs told bridge users: the device plugin's resource name, nothing else.
    ops.apply(MANAGED, &bridged_pod("notebook", "{nvidia.com/mig-1g.10gb: 1}", &[]));
    let job = h.job_of("notebook").await;
    ops.wait_running(MANAGED, "notebook").await;
    let detail = h.slurm.scontrol(&["show", "job", "-d", &job]);
    let (alloc, total) = (h.node_field("CPUAlloc"), h.node_field("CPUTot"));
    let field = |key: &str| slurm::field(&detail, key);
    let gpus = slurm::job_gpus(&detail);
    steps.say(&format!(
        "1. nvidia.com/mig-1g.10gb: job {job} running, asked {}, Exclusive={}, holds CPUs \
         {alloc}/{total} and GPUs {gpus:?}; claims {:?}",
        field("ReqTRES"),
        field("Exclusive"),
        h.claims_of("notebook")
    ));
    // It asks for no GPU, but exclusively: Slurm gives it the node, every GPU with it.
    assert!(!field("ReqTRES").contains("gres/"), "the bridge asked Slurm for a GRES this time:\n{detail}");
    assert_eq!(field("Exclusive"), "NODE", "the bridge's job is not node-exclusive:\n{detail}");
    assert_eq!(alloc, total, "the bridge's job does not hold every CPU of the node:\n{detail}");
    assert_eq!(gpus, Ok(vec![0, 1]), "the bridge's job does not hold both GPUs:\n{detail}");
    assert!(h.claims_of("notebook").is_empty(), "the pod got a claim: {:?}", h.claims_of("notebook"));
    let inside = ops.exec(MANAGED, "notebook", "echo \"[$NVIDIA_VISIBLE_DEVICES]\"; ls /dev | grep -c nvidia || true");
    assert!(inside.starts_with("[]"), "the container sees a GPU: {inside}");
    assert_eq!(prepared(&h.cluster.node), (vec![], vec![], vec![]), "migdra prepared something for it");
    // A native job asking one shard waits while the pod's job holds the node, and runs once it ends.
    let native = h.slurm.submit("native-1", "shard:1");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(h.slurm.job_state(&native), "PENDING", "a native job ran beside the bridge's whole-node job");
    h.end("notebook", &job).await;
    let k = h.slurm.running_index(&native);
    steps.say(&format!("   a native shard job waited for the whole node, then ran on GPU {k} once the pod ended"));
    h.slurm.cancel(&native);

    // 1b. The same with a shard annotation, not exclusive: Slurm books a shard, nobody reads it.
    let annotations = [(bridge::GRES_ANNOTATION, "gres/shard:1"), (bridge::EXCLUSIVE_ANNOTATION, "false")];
    ops.apply(MANAGED, &bridged_pod("annotated", "{nvidia.com/mig-1g.10gb: 1}", &annotations));
    let job = h.job_of("annotated").await;
    ops.wait_running(MANAGED, "annotated").await;
    let slurm_k = h.slurm.reserved_index(&job);
    let inside = ops.exec(MANAGED, "annotated", "echo \"[$NVIDIA_VISIBLE_DEVICES]\"");
    steps.say(&format!(
        "1b. + gres/shard:1, not exclusive: Slurm booked a shard of GPU {slurm_k}; claims {:?}; container sees {}",
        h.claims_of("annotated"),
        inside.trim()
    ));
    assert!(h.claims_of("annotated").is_empty(), "the shard became a claim: {:?}", h.claims_of("annotated"));
    assert!(inside.starts_with("[]"), "the container sees a GPU: {inside}");
    assert_eq!(prepared(&h.cluster.node), (vec![], vec![], vec![]), "migdra prepared something for it");
    h.end("annotated", &job).await;

    // 2. DynamicResources in the bridge's profile (configuration only) and a shard annotation,
    // while a native job holds one GPU whole: Slurm books the pod's shard on the other GPU, and
    // kube-scheduler, which knows nothing of Slurm, allocates first fit.
    h.bridge.restart_scheduler(Profile::WithDynamicResources);
    let native = h.slurm.submit("native-whole", "gpu:1");
    let native_k = h.slurm.running_index(&native);
    let ops = &h.cluster.ops;
    ops.apply(MANAGED, &bridged_pod("sharded", "{nvidia.com/mig-1g.10gb: 1}", &annotations));
    let job = h.job_of("sharded").await;
    ops.wait_running(MANAGED, "sharded").await;
    let uuid = ops.device_inside(MANAGED, "sharded").await;
    let slurm_k = h.slurm.reserved_index(&job);
    let (_, status) = h.prepared_claim("sharded");
    let data = &status["data"];
    let claim_k = data["slurmGpuIndex"].as_u64().expect("slurmGpuIndex in the claim's status");
    steps.say(&format!(
        "2. + DynamicResources, gres/shard:1, a native job on GPU {native_k}: Slurm booked GPU {slurm_k}; \
         kube-scheduler allocated {}, migdra prepared {} on slurmGpuIndex {claim_k}",
        status["device"], data["migUUID"]
    ));
    assert_eq!(data["migUUID"].as_str(), Some(uuid.as_str()), "the container's device is not the claim's");
    assert!(uuid.starts_with("MIG-"), "the container has {uuid}, not a MIG device");
    assert_ne!(claim_k, u64::from(slurm_k), "Slurm and Kubernetes agree on the GPU: the bridge pins the claim now");
    assert_eq!(claim_k, u64::from(native_k), "the MIG device is not on the GPU the native job holds whole");
    h.end("sharded", &job).await;
    h.slurm.cancel(&native);
    assert_eq!(prepared(&h.cluster.node), (vec![], vec![], vec![]), "the released MIG device left something");
    steps.say("   pod deleted: the bridge cancelled its job, migdra destroyed the instance");
}

/// Where a pod's whole GPU and a native job's land: Slurm's index of the pod's job, the
/// `slurmGpuIndex` of the GPU in the pod's container, and the native job's index.
struct WholeGpu {
    pod_k: u64,
    held_k: u64,
    native_k: u64,
}

/// Step 3, whole GPUs the bridge's way: migdra publishes them as driver `gpu.nvidia.com` (the
/// bridge reads no other NVIDIA driver), the GRES type is the DeviceClass's name, MIG is off. A
/// pod asks one GPU through the bridge, then a native job asks one; `None` when it cannot run here.
async fn whole_gpus(steps: &Steps, variant: Variant) -> Option<WholeGpu> {
    let class = "gpu.nvidia.com";
    let h = hybrid(steps, variant, "h100-80gb:2:mig-off", Some(class), &[("MIGDRA_DRIVER_NAME", class)]).await?;
    let ops = &h.cluster.ops;
    ops.apply(
        "default",
        &format!(
            "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: {class}\nspec:\n  selectors:\n\
             \x20 - cel:\n      expression: device.driver == \"{class}\"\n"
        ),
    );
    let annotations = [(bridge::EXCLUSIVE_ANNOTATION, "false")];
    ops.apply(
        MANAGED,
        &bridged_pod("trainer", &format!("{{deviceclass.resource.kubernetes.io/{class}: 1}}"), &annotations),
    );
    let job = h.job_of("trainer").await;
    ops.wait_running(MANAGED, "trainer").await;
    let uuid = ops.device_inside(MANAGED, "trainer").await;
    let pod_k = u64::from(h.slurm.reserved_index(&job));
    let slices = ops.json(&["get", "resourceslices", "-l", &format!("{class}/node={NODE_NAME}")]);
    let devices: Vec<&Value> = slices["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .collect();
    let attr = |d: &Value, a: &str| d["attributes"][a].clone();
    let held = devices
        .iter()
        .find(|d| attr(d, "uuid")["string"].as_str() == Some(uuid.as_str()))
        .unwrap_or_else(|| panic!("no published device has the container's {uuid}"));
    let held_k = attr(held, "slurmGpuIndex")["int"].as_u64().expect("slurmGpuIndex on the held GPU");
    // A native job asking one GPU: Slurm gives it the GPU it thinks is free.
    let native = h.slurm.submit("native-gpu", "gpu:1");
    let native_k = u64::from(h.slurm.running_index(&native));
    steps.say(&format!(
        "3. {class}, {variant:?} bridge: Slurm booked GPU {pod_k} for the pod; the bridge allocated {} \
         (slurmGpuIndex {held_k}, {uuid}); a native job then got GPU {native_k}",
        held["name"]
    ));
    h.slurm.cancel(&native);
    h.end("trainer", &job).await;
    Some(WholeGpu { pod_k, held_k, native_k })
}

/// The negative control: the bridge as it is maps Slurm's index k to the device named `gpu-k`
/// (the minor), which is not Slurm's GPU k here (NVML index 0 is minor 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_slurm_bridge_books_a_whole_gpu_twice() {
    let _serial = SERIAL.lock().await;
    let Some(w) = whole_gpus(&Steps(Instant::now()), Variant::Unchanged).await else { return };
    assert_ne!(w.pod_k, w.held_k, "the bridge allocated the GPU Slurm booked: it reads slurmGpuIndex now");
    assert_eq!(w.native_k, w.held_k, "the native job did not get the pod's GPU: no double booking");
}

/// With the patch series the device's `slurmGpuIndex` wins over its name: the pod gets the GPU
/// Slurm booked, and the native job the other one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_patched_slurm_bridge_gives_the_pod_slurms_gpu() {
    let _serial = SERIAL.lock().await;
    let Some(w) = whole_gpus(&Steps(Instant::now()), Variant::Patched).await else { return };
    assert_eq!(w.pod_k, w.held_k, "the pod's GPU is not the one Slurm booked for it");
    assert_ne!(w.native_k, w.held_k, "the native job got the pod's GPU");
}

/// With the patch series a MIG pod asks exactly what migdra's docs tell bridge users to ask
/// (`nvidia.com/mig-<profile>: 1`, nothing else): the bridge reserves the partition's
/// `slurmShards` as shards on one GPU, not the node, and writes the pod's claim for a partition of
/// that profile on the GPU Slurm booked that fits beside the allocated ones. A native job holding
/// one GPU whole keeps both MIG pods on the other, and Slurm's shards there are theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stdout, clippy::too_many_lines)] // the test's report; one scenario in steps
async fn the_patched_slurm_bridge_gives_mig_pods_slurms_gpu() {
    let _serial = SERIAL.lock().await;
    let steps = Steps(Instant::now());
    let Some(h) = hybrid(&steps, Variant::Patched, "h100-80gb:2", None, &[]).await else { return };
    let ops = &h.cluster.ops;
    let native = h.slurm.submit("native-whole", "gpu:1");
    let native_k = h.slurm.running_index(&native);
    let mut held = Vec::new();
    for (pod, profile, shards) in [("notebook", "1g.10gb", 1), ("inference", "3g.40gb", 4)] {
        ops.apply(MANAGED, &bridged_pod(pod, &format!("{{nvidia.com/mig-{profile}: 1}}"), &[]));
        let job = h.job_of(pod).await;
        ops.wait_running(MANAGED, pod).await;
        let uuid = ops.device_inside(MANAGED, pod).await;
        let detail = h.slurm.scontrol(&["show", "job", "-d", &job]);
        let field = |key: &str| slurm::field(&detail, key).to_string();
        let slurm_k = h.slurm.reserved_index(&job);
        let (claim, status) = h.prepared_claim(pod);
        let data = &status["data"];
        let selector = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"].clone();
        steps.say(&format!(
            "{pod}: nvidia.com/mig-{profile}: job {job} asked {}, Exclusive={}, Slurm booked GPU {slurm_k} \
             (a native job holds GPU {native_k}); the bridge allocated {}, migdra prepared {} on slurmGpuIndex {}",
            field("TresPerNode"),
            field("Exclusive"),
            status["device"],
            data["migUUID"],
            data["slurmGpuIndex"]
        ));
        assert_eq!(
            field("TresPerNode"),
            format!("gres/shard={shards}"),
            "job {job} does not ask {shards} shards:\n{detail}"
        );
        assert_ne!(field("Exclusive"), "NODE", "a MIG pod's job holds the whole node:\n{detail}");
        assert_ne!(slurm_k, native_k, "Slurm booked the pod's shards on the GPU the native job holds whole");
        assert_eq!(data["slurmGpuIndex"].as_u64(), Some(u64::from(slurm_k)), "the MIG device is not on Slurm's GPU");
        assert_eq!(data["profile"], profile, "the pod got another profile");
        assert_eq!(data["slurmShards"].as_u64(), Some(shards), "migdra's shards for {profile}");
        assert_eq!(data["migUUID"].as_str(), Some(uuid.as_str()), "the container's device is not the claim's");
        let pinned = format!("slurmGpuIndex == {slurm_k}");
        assert!(
            selector.as_str().is_some_and(|s| s.contains(&pinned)),
            "the claim does not select Slurm's GPU: {selector}"
        );
        held.push((pod, job, status["device"].as_str().unwrap().to_owned()));
    }
    assert_ne!(held[0].2, held[1].2, "two pods got the same partition");
    let (instances, _, _) = prepared(&h.cluster.node);
    assert_eq!(instances.len(), 2, "migdra prepared {instances:?}");
    for (pod, job, _) in &held {
        h.end(pod, job).await;
    }
    h.slurm.cancel(&native);
    assert_eq!(prepared(&h.cluster.node), (vec![], vec![], vec![]), "the released MIG devices left something");
    steps.say("both pods deleted: the bridge cancelled their jobs, migdra destroyed the instances");

    // A prepare that fails: migdra reports Ready=False, the bridge cancels the job so Slurm frees
    // the shard, and deletes the pod. (The fault stays until cleared: the kubelet's retries fail too.)
    sim_fail(&h.cluster.node, "create-gi=insufficient-resources:1000");
    ops.apply(MANAGED, &bridged_pod("doomed", "{nvidia.com/mig-1g.10gb: 1}", &[]));
    let job = h.job_of("doomed").await;
    h.job_ends(&job, "doomed's job cancelled after its failed prepare").await;
    let gone = ops.kubectl(&["wait", "pod", "-n", MANAGED, "doomed", "--for=delete", "--timeout=60s"]);
    let out = support::command::migdra()
        .args(["sim", "fail", "--clear", "--sim-state"])
        .arg(h.cluster.node.sim_state())
        .output()
        .unwrap();
    assert!(out.status.success(), "migdra sim fail --clear: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(prepared(&h.cluster.node), (vec![], vec![], vec![]), "the failed prepare left something");
    steps.say(&format!(
        "failed prepare: job {job} cancelled (state {}), pod deleted ({})",
        h.slurm.job_state(&job),
        gone.trim()
    ));

    // A pod deleted before it was bound: its job, pending behind a native job holding both GPUs,
    // is cancelled and the pod does not stay Terminating.
    let both = h.slurm.submit("native-both", "gpu:2");
    h.slurm.wait_for(|s| s.job_state(&both) == "RUNNING", "the native job on both GPUs RUNNING");
    ops.apply(MANAGED, &bridged_pod("waiting", "{nvidia.com/mig-1g.10gb: 1}", &[]));
    let job = h.job_of("waiting").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(h.slurm.job_state(&job), "PENDING", "the waiting pod's job is not pending");
    ops.kubectl(&["delete", "pod", "-n", MANAGED, "waiting", "--wait=true", "--timeout=60s"]);
    h.job_ends(&job, "the unbound pod's job cancelled").await;
    h.slurm.cancel(&both);
    steps.say(&format!("a pod deleted while its job {job} was pending: gone, and the job {}", h.slurm.job_state(&job)));
}

/// Slurm and Kubernetes share one MIG node through the patched bridge, with every
/// component restarted once (`shared_node`); the unchanged bridge, same harness and seed, is the
/// negative control. Figures: docs/bridge-contract.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::print_stdout)] // the run's report
async fn slurm_and_kubernetes_share_a_mig_node_through_the_bridge() {
    let _serial = SERIAL.lock().await;
    let steps = Steps(Instant::now());
    let n = shared_node::setting("MIGDRA_SHARED_STEPS", 8) as usize;
    let seed = shared_node::setting("MIGDRA_SHARED_SEED", 1);
    let Some(patched) = shared_node::run(&steps, Variant::Patched, n, seed, false).await else { return };
    let Some(unchanged) = shared_node::run(&steps, Variant::Unchanged, n, seed, true).await else { return };
    let median = |d: &[Duration]| {
        let mut d = d.to_vec();
        d.sort_unstable();
        d.get(d.len() / 2).copied()
    };
    println!(
        "shared node, seed {seed}: patched bridge {} pods, {} native jobs, {} checks, {} disagreements, restarts {:?}, \
         pod to Running median {:?}; one pod alone, creation to Running (median of 3): through the bridge {:?}, \
         through kube-scheduler {:?}; unchanged bridge, until its first disagreement: {} pods, {} checks, first: {:?}",
        patched.pods,
        patched.jobs,
        patched.checks,
        patched.disagreements.len(),
        patched.restarts,
        median(&patched.to_running),
        median(&patched.via_bridge),
        median(&patched.via_kube_scheduler),
        unchanged.pods,
        unchanged.checks,
        unchanged.disagreements.first()
    );
    assert_eq!(patched.disagreements, Vec::<String>::new(), "the patched bridge and Slurm disagree");
    assert!(patched.checks > n, "too few checks: {patched:?}");
    assert!(!unchanged.disagreements.is_empty(), "the unchanged bridge shows no disagreement: the harness cannot fail");
}
