//! The loop the project exists for, end to end on one hybrid node: the real slurmctld and slurmd
//! (Debian's), the real control plane (kube-apiserver, kube-scheduler, kube-controller-manager)
//! and `migdra serve` on simulated H100s, with the test standing in for a bridge that keeps the
//! contract (docs/bridge-contract.md, "The loop, step by step"). It is the contract a bridge must
//! implement, not what slurm-bridge does: the real bridge at `6f700ba` does none of these steps
//! (tests/node/bridge.rs runs it and pins what it does instead):
//!
//! 1. a Slurm job reserves the shards a profile stands for (`shard:N`); Slurm picks GPU k. On
//!    Slurm 26.05 the test makes slurm-bridge's own calls to slurmrestd v0.0.44: `POST job/submit`
//!    of an external job (`EXTERNAL_JOB`, AdminComment `{"pods":["ns/name"]}`), `GET
//!    resources/{job_id}` for `gres[].index` as its PreBind reads it, `DELETE job/{job_id}` to
//!    release; on 22.05, which has neither, `sbatch` and `scancel` stand in;
//! 2. a claim for that profile, pinned with `slurmGpuIndex == k`, is allocated by kube-scheduler;
//! 3. migdra creates the instance on the GPU Slurm calls k, and the claim status says k, the
//!    shards and the MIG UUID;
//! 4. while the shards are held, a native job for a whole GPU cannot get GPU k;
//! 5. a prepare that fails (an injected NVML fault) shows `Ready=False`, and the test releases
//!    that Slurm job as the bridge would;
//! 6. the pods end: the instances go, the Slurm jobs are released, and the native job gets GPU k;
//! 7. migdra, kube-scheduler and slurmctld each restart once on the way, and nothing is lost or
//!    counted twice: after the restarts both schedulers still refuse a 7g on GPU k and grant a
//!    4g beside the 1g, and after slurmctld's a new shard job and its claim meet on one GPU.
//!
//! Slurm's configuration is what `migdra slurm-conf` prints for the node. Needs root, Slurm
//! (`hack/slurm-deps.sh` for 22.05, `hack/slurm-2605.sh` and `MIGDRA_SLURM_BIN` for 26.05) and the
//! control plane (`hack/build-controlplane.sh`); `hack/test.sh` provides them and runs it on both.

#![allow(clippy::print_stdout)] // the test prints each step

mod support;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use migdra::kubelet::client::{TestKubelet, Version};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;
use support::cluster::{Outcome, allocated, apply, claim_ref, create_node, ours, outcome, pool, repo};
use support::command::Run;
use support::controlplane::ControlPlane;
use support::daemon::Daemon;
use support::eventually::eventually;
use support::node::NodeDir;
use support::slurm::{self, Slurm};
use support::{DRIVER, NAMESPACE as NS, NODE};

/// Two GPUs: one for the bridge's shards, one for a native whole-GPU job.
const SPEC: &str = "h100-80gb:2";

/// Everything the loop runs on. Fields drop in this order: migdra, then the control plane, then
/// Slurm, then the files.
struct Loop {
    kubelet: TestKubelet,
    daemon: Daemon,
    client: kube::Client,
    cp: ControlPlane,
    slurm: Slurm,
    node: NodeDir,
    /// `migdra serve`'s flags for Slurm.
    slurm_flags: Vec<String>,
    /// Device → its `slurmGpuIndex` attribute, as published.
    slurm_index: BTreeMap<String, i64>,
    /// How the bridge's placeholders are made on this Slurm.
    bridge: &'static str,
}

impl Loop {
    fn diagnostics(&self) -> String {
        format!("{}\n{}", self.daemon.log_tail(), self.cp.logs())
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn published(&self) -> Vec<ResourceSlice> {
        pool(&self.client, NODE, Duration::from_secs(60), || self.diagnostics()).await.0
    }

    /// Start migdra (again) on the node, registered with the test kubelet.
    async fn serve(node: &NodeDir, flags: &[String]) -> (Daemon, TestKubelet) {
        node.serve().args(flags).registered().await
    }

    /// The bridge's claim: one device of `class`, on the GPU Slurm calls `k`; and a pod using it.
    async fn claim_for(&self, name: &str, class: &str, k: u32) -> ResourceClaim {
        let selector = format!("device.attributes[\"{DRIVER}\"].slurmGpuIndex == {k}");
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": class,
                "selectors": [{"cel": {"expression": selector}}]
            }}]}}
        }))
        .unwrap();
        self.claims().create(&PostParams::default(), &claim).await.unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": false,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                "containers": [{
                    "name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}
                }]
            }
        }))
        .unwrap();
        self.pods().create(&PostParams::default(), &pod).await.unwrap();
        claim
    }

    async fn outcome(&self, pod: &str) -> Outcome {
        outcome(&self.pods(), pod, Duration::from_secs(60), || self.diagnostics()).await
    }

    /// The claim once bound: its device, which must be on the GPU Slurm calls `k`.
    async fn bound_device(&self, name: &str, k: u32) -> (ResourceClaim, String) {
        match self.outcome(name).await {
            Outcome::Bound => {}
            Outcome::Unschedulable(m) => panic!("{name} unschedulable: {m}\n{}", self.diagnostics()),
        }
        let c = self.claims().get(name).await.unwrap();
        let devices = allocated(&c);
        assert_eq!(devices.len(), 1, "{name}: {:?}", c.status);
        assert_eq!(self.slurm_index[&devices[0]], i64::from(k), "{name} allocated {} off GPU {k}", devices[0]);
        (c, devices[0].clone())
    }

    /// Our status entry for `device` on claim `name`, once written.
    async fn status(&self, name: &str, device: &str) -> Value {
        eventually(format!("a status for {device} on claim {name}"))
            .every(Duration::from_millis(100))
            .explain(|| self.diagnostics())
            .until_async(move || async move {
                let c = self.claims().get(name).await.unwrap();
                ours(&c).into_iter().find(|d| d["device"] == device).ok_or_else(|| format!("{:?}", c.status))
            })
            .await
    }

    /// The MIG UUID of the instance `device` names on the hardware, if it exists.
    fn instance(&self, device: &str) -> Option<String> {
        let layout = self.node.layout();
        layout["gpus"].as_array().unwrap().iter().flat_map(|g| g["instances"].as_array().unwrap().iter()).find_map(
            |i| {
                (i["device"] == device)
                    .then(|| i["compute_instances"][0]["uuid"].as_str().unwrap_or_default().to_string())
            },
        )
    }

    fn instance_count(&self) -> usize {
        let layout = self.node.layout();
        layout["gpus"].as_array().unwrap().iter().map(|g| g["instances"].as_array().unwrap().len()).sum()
    }

    /// Prepare as the kubelet does, which must succeed; checks the instance and the status data,
    /// and prints the step's line with Slurm's IDX beside migdra's index.
    async fn prepare_ok(&self, step: &str, name: &str, job: &str, k: u32, shards: u64) -> String {
        let (c, device) = self.bound_device(name, k).await;
        let r = claim_ref(&c);
        let out = self.kubelet.prepare(Version::V1, std::slice::from_ref(&r)).await.unwrap();
        let got = out[&r.uid].as_ref().unwrap_or_else(|e| panic!("prepare {name}: {e}\n{}", self.diagnostics()));
        assert_eq!(got.iter().map(|d| d.device.as_str()).collect::<Vec<_>>(), [device.as_str()]);
        let mig_uuid = self.instance(&device).unwrap_or_else(|| panic!("{device} prepared but not created"));
        let e = self.status(name, &device).await;
        assert_eq!(e["conditions"][0]["status"], "True", "{e}");
        let data = &e["data"];
        assert_eq!(data["slurmGpuIndex"].as_u64(), Some(u64::from(k)), "{data}");
        assert_eq!(data["slurmShards"].as_u64(), Some(shards), "{data}");
        assert_eq!(data["migUUID"].as_str(), Some(mig_uuid.as_str()), "{data}");
        let idx = self.slurm.job_index(job);
        let rest = if slurm::has_bridge_api() {
            format!(", REST gres[].index {:?}", self.slurm.rest_index(job).unwrap())
        } else {
            String::new()
        };
        println!(
            "{step}: claim {name} -> {device}, {mig_uuid}; Slurm job {job} IDX:{idx}{rest} | \
             migdra slurmGpuIndex {} ({} shard(s))",
            data["slurmGpuIndex"], data["slurmShards"]
        );
        assert_eq!(u64::from(idx), data["slurmGpuIndex"].as_u64().unwrap(), "Slurm and migdra disagree on the GPU");
        device
    }

    /// The pod ends: NodeUnprepareResources, then the pod is deleted and its claim deallocated.
    async fn end(&self, name: &str) {
        let c = self.claims().get(name).await.unwrap();
        let devices = allocated(&c);
        let r = claim_ref(&c);
        let out = self.kubelet.unprepare(Version::V1, std::slice::from_ref(&r)).await.unwrap();
        assert_eq!(out[&r.uid], "", "unprepare {name}");
        for d in &devices {
            assert_eq!(self.instance(d), None, "{d} still exists after unprepare");
        }
        self.pods().delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
        eventually(format!("claim {name} deallocated"))
            .within(Duration::from_secs(30))
            .every(Duration::from_millis(100))
            .explain(|| self.diagnostics())
            .until_async(move || async move {
                let c = self.claims().get(name).await.unwrap();
                if allocated(&c).is_empty() { Ok(()) } else { Err(format!("{:?}", c.status)) }
            })
            .await;
        self.claims().delete(name, &DeleteParams::default()).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_and_slurm_agree_on_every_slice_of_the_loop() {
    if !slurm::required() {
        return;
    }
    // Slurm first, configured from what `migdra slurm-conf` prints for the node.
    let node = NodeDir::new().simulate(SPEC);
    let slurm_dir = node.path().join("slurm");
    std::fs::create_dir_all(&slurm_dir).unwrap();
    let (host, dev) = (slurm::host(), node.path().join("dev"));
    let conf = node
        .command(&["slurm-conf", "-o", "json", "--slurm-node-name", &host, "--slurmd", "none"])
        .args(["--dev-root", dev.to_str().unwrap(), "--slurm-conf", slurm_dir.join("slurm.conf").to_str().unwrap()])
        .json();
    let slurm = slurm::from_slurm_conf(&slurm_dir, &conf);
    println!("slurm (from migdra slurm-conf): Gres={}", conf["gres"]);

    // The control plane, the Node and the DeviceClasses of daemonset/.
    let cp = ControlPlane::start().await;
    println!("control plane: {} (started in {:.1?})", cp.versions, cp.startup);
    let client = cp.client().await;
    create_node(&client, NODE).await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    apply(&client, &repo().join("daemonset/base/deviceclasses.yaml"), NS).await;

    let node = node.kubeconfig(cp.kubeconfig().to_path_buf());
    // The slurmd of the release under test, never whichever is on PATH.
    let slurm_flags = vec![
        "--slurm-conf".to_string(),
        slurm.conf.display().to_string(),
        "--slurm-node-name".into(),
        slurm::host(),
        "--slurmd".into(),
        slurm::bin("slurmd").display().to_string(),
    ];
    let (daemon, kubelet) = Loop::serve(&node, &slurm_flags).await;
    let bridge = if slurm::has_bridge_api() {
        "external job via slurmrestd v0.0.44, as slurm-bridge"
    } else {
        "batch job via sbatch: 22.05 has no external jobs"
    };
    let mut lp = Loop { kubelet, daemon, client, cp, slurm, node, slurm_flags, slurm_index: BTreeMap::new(), bridge };
    for d in lp.published().await.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
        let index = d.attributes.as_ref().and_then(|a| a.get("slurmGpuIndex")).and_then(|a| a.int);
        lp.slurm_index.insert(d.name.clone(), index.expect("every device carries slurmGpuIndex"));
    }

    // 1. The bridge's placeholder for a 1g.10gb: one shard; Slurm picks the GPU.
    let a = lp.slurm.reserve(&format!("{NS}/loop-a"), "shard:1");
    let k = lp.slurm.reserved_index(&a);
    println!("step 1: Slurm job {a} (shard:1, {}) runs on GPU IDX:{k}", lp.bridge);

    // 2 and 3. The claim pinned to k is allocated there, and migdra creates it on that GPU.
    lp.claim_for("loop-a", "mig-1g.10gb", k).await;
    let dev_a = lp.prepare_ok("step 2-3", "loop-a", &a, k, 1).await;

    // 4. A native job for a whole GPU gets the other GPU; a second one cannot have GPU k.
    let n1 = lp.slurm.submit("native-1", "gpu:1");
    let n1_idx = lp.slurm.running_index(&n1);
    assert_ne!(n1_idx, k, "a whole GPU was granted on GPU {k}, whose shards the bridge holds");
    let n2 = lp.slurm.submit("native-2", "gpu:1");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(lp.slurm.job_state(&n2), "PENDING", "native-2 must wait: GPU {k} serves shards, the other is taken");
    println!(
        "step 4: native job {n1} (gpu:1) runs on IDX:{n1_idx}; native job {n2} (gpu:1) waits while \
         IDX:{k} serves shards"
    );
    // A pending whole-GPU job holds a backfill reservation on GPU k (its jobs have no time limit),
    // so every later shard job would queue behind it, the bridge's too: Slurm's FIFO, not a
    // conflict. The test holds it until step 6, as an admin would let the bridge's jobs pass.
    lp.slurm.hold(&n2, true);

    // 5. A prepare that fails: the bridge's job for a 2g.20gb runs, the claim is allocated, but
    //    NVML refuses the GPU instance. The status says Ready=False; the bridge releases the job.
    let b = lp.slurm.reserve(&format!("{NS}/loop-b"), "shard:2");
    let kb = lp.slurm.reserved_index(&b);
    assert_eq!(kb, k, "the only GPU serving shards");
    lp.claim_for("loop-b", "mig-2g.20gb", kb).await;
    let (cb, dev_b) = lp.bound_device("loop-b", kb).await;
    lp.node.cli(&["sim", "fail", "create-gi=insufficient-resources:1"]);
    let rb = claim_ref(&cb);
    let out = lp.kubelet.prepare(Version::V1, std::slice::from_ref(&rb)).await.unwrap();
    let err = out[&rb.uid].as_ref().expect_err("the injected fault fails the prepare");
    let e = lp.status("loop-b", &dev_b).await;
    assert_eq!(e["conditions"][0]["status"], "False", "{e}");
    assert_eq!(e["conditions"][0]["reason"], "PrepareFailed", "{e}");
    assert_eq!(lp.instance(&dev_b), None, "nothing half-created for the failed claim");
    lp.slurm.release(&b);
    println!("step 5: claim loop-b on {dev_b}: prepare failed ({err}); status Ready=False; Slurm job {b} released");
    lp.node.cli(&["sim", "fail", "--clear"]);
    lp.pods().delete("loop-b", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    lp.claims().delete("loop-b", &DeleteParams::default()).await.unwrap();

    // 7b and 7c. migdra and kube-scheduler restart; the 1g stays prepared and counted.
    lp.daemon.kill();
    let (daemon, kubelet) = Loop::serve(&lp.node, &lp.slurm_flags).await;
    (lp.daemon, lp.kubelet) = (daemon, kubelet);
    lp.published().await;
    assert!(lp.instance(&dev_a).is_some(), "{dev_a} survives migdra's restart");
    lp.cp.restart("kube-scheduler");
    println!("step 7b-c: migdra and kube-scheduler restarted; {dev_a} still there");

    // After the restarts: a 4g beside the 1g is granted by both schedulers on GPU k, and a 7g is
    // refused by both (Slurm: not enough free shards; Kubernetes: the counters).
    let d = lp.slurm.reserve(&format!("{NS}/loop-d"), "shard:4");
    assert_eq!(lp.slurm.reserved_index(&d), k);
    lp.claim_for("loop-d", "mig-4g.40gb", k).await;
    let dev_d = lp.prepare_ok("step 7d", "loop-d", &d, k, 4).await;
    let e = lp.slurm.reserve(&format!("{NS}/loop-e"), "shard:8");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(lp.slurm.job_state(&e), "PENDING", "Slurm has 3 shards left on GPU {k}, not 8");
    lp.slurm.release(&e);
    lp.claim_for("loop-e", "mig-7g.80gb", k).await;
    match lp.outcome("loop-e").await {
        Outcome::Unschedulable(m) => {
            println!("step 7e: a 7g on IDX:{k}: Slurm keeps shard:8 pending, and kube-scheduler: {m}")
        }
        Outcome::Bound => panic!("a 7g.80gb was allocated on GPU {k} beside {dev_a} and {dev_d}: counted twice"),
    }
    lp.pods().delete("loop-e", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    lp.claims().delete("loop-e", &DeleteParams::default()).await.unwrap();

    // 6. The pods end: unprepare destroys the instances, the bridge releases its jobs, and the
    //    waiting native job gets GPU k.
    lp.end("loop-a").await;
    lp.end("loop-d").await;
    lp.slurm.release(&a);
    lp.slurm.release(&d);
    lp.slurm.hold(&n2, false);
    let n2_idx = lp.slurm.running_index(&n2);
    assert_eq!(n2_idx, k, "native-2 takes the GPU the shards freed");
    println!(
        "step 6: pods ended, instances destroyed, Slurm jobs {a} and {d} released; native job {n2} \
         now runs on IDX:{n2_idx}"
    );

    // 7f. slurmctld restarts (SIGTERM, as systemctl does) while both native jobs run. Debian's
    //     Slurm 22.05 loses its shard accounting when it restarts with shard jobs running (new
    //     shard jobs are refused: "Requested node configuration is not available"), a Slurm bug
    //     fixed later, so the restart comes when none runs. Afterwards both schedulers still agree:
    //     the next shard job goes to the GPU a native job frees, and the claim pinned there too.
    lp.slurm.restart_slurmctld();
    lp.slurm.wait_for(|s| s.job_state(&n1) == "RUNNING" && s.job_state(&n2) == "RUNNING", "native jobs after restart");
    assert_eq!((lp.slurm.job_index(&n1), lp.slurm.job_index(&n2)), (n1_idx, k), "the jobs kept their GPUs");
    let f = lp.slurm.reserve(&format!("{NS}/loop-f"), "shard:1");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(lp.slurm.job_state(&f), "PENDING", "both GPUs are taken whole");
    lp.slurm.cancel(&n1);
    let kf = lp.slurm.reserved_index(&f);
    assert_eq!(kf, n1_idx, "the shard job takes the GPU native-1 freed");
    lp.claim_for("loop-f", "mig-1g.10gb", kf).await;
    lp.prepare_ok("step 7f (after the slurmctld restart)", "loop-f", &f, kf, 1).await;
    lp.end("loop-f").await;
    lp.slurm.release(&f);
    lp.slurm.cancel(&n2);
    assert_eq!(lp.instance_count(), 0, "no MIG instance left");
    assert!(lp.node.checkpoint().is_empty(), "no claim left in the checkpoint: {:?}", lp.node.checkpoint());
}
