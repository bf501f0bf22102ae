//! `migdra serve` against the fake Kubernetes API server of tests/support (tests/controlplane.rs
//! runs it against a real one): slices in the layout of the server's version, drift repair, claims read
//! from the API, status written for slurm-bridge, bad claims, and an outage.

#![allow(clippy::print_stdout)] // the outage test prints its convergence time

use crate::support::claim::Claim;
use crate::support::cluster::complete;
use crate::support::daemon::Daemon;
use crate::support::eventually::eventually;
use crate::support::fake_apiserver::{ApiServer, Options};
use crate::support::node::NodeDir;
use crate::support::{DRIVER, NAMESPACE, NODE};
use k8s_openapi::api::resource::v1::ResourceSlice;
use migdra::claims::ClaimRef;
use migdra::kube::slices::{self, Layout};
use migdra::kubelet::client::Version;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const SPEC: &str = "h100-80gb:2,a100-40gb:1:mig-off";

/// Simulated GPUs, a Node object, and `migdra serve` reading claims from the API server.
fn start(api: &ApiServer) -> (NodeDir, Daemon) {
    let node = NodeDir::new().simulate(SPEC);
    api.insert(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let kubeconfig = api.kubeconfig(node.path());
    let node = node.kubeconfig(kubeconfig);
    let daemon = node.serve().spawn();
    (node, daemon)
}

/// Our slices once the pool is complete (every slice of the newest generation is there).
async fn published(api: &ApiServer, timeout: Duration) -> Vec<ResourceSlice> {
    let all = || api.list("resourceslices").into_iter().map(|v| serde_json::from_value(v).unwrap()).collect();
    eventually("a complete pool published")
        .within(timeout)
        .every(Duration::from_millis(50))
        .until(|| complete(all()))
        .await
}

/// The claim on the API server, with another driver's device in its status beside ours.
fn claim_object(claim: &Claim) -> Value {
    let mut object = claim.object();
    object["status"]["devices"] = json!([{"driver": "nic.example.com", "pool": NODE, "device": "eth1"}]);
    object
}

fn claim(uid: &str, name: &str) -> ClaimRef {
    Claim::new(uid).named(name).reference()
}

fn ours(claim: &Value) -> Vec<Value> {
    claim["status"]["devices"]
        .as_array()
        .map(|a| a.iter().filter(|d| d["driver"] == DRIVER).cloned().collect())
        .unwrap_or_default()
}

async fn status_until(api: &ApiServer, name: &str, f: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let (c, o) = eventually(format!("the status of claim {name}"))
        .every(Duration::from_millis(50))
        .until(|| {
            let c = api.get(&format!("resourceclaims/{NAMESPACE}/{name}")).expect("claim");
            let o = ours(&c);
            if f(&o) { Ok((c, o)) } else { Err(c.to_string()) }
        })
        .await;
    assert_eq!(c["status"]["devices"].as_array().unwrap()[0]["driver"], "nic.example.com", "others' entries stay");
    o
}

/// The layout follows the server's version; the slices pass the API's validation rules, carry
/// every partition with its counters, and are owned by the Node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_follow_the_server_version() {
    for (minor, layout) in [(36, Layout::Split), (34, Layout::Combined)] {
        let api = ApiServer::start_with(Options { major: 1, minor, partitionable_devices: true }).await;
        let (_node, _daemon) = start(&api);
        let slices = published(&api, Duration::from_secs(20)).await;
        assert_eq!(slices::validate(&slices, layout), Vec::<String>::new(), "1.{minor}");
        let devices: Vec<&str> =
            slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.as_str()).collect();
        assert_eq!(devices.len(), 25 * 2 + 1, "every H100 partition and the whole A100");
        let node_uid = api.get(&format!("nodes/{NODE}")).unwrap()["metadata"]["uid"].as_str().unwrap().to_string();
        for s in &slices {
            let owner = &s.metadata.owner_references.as_ref().expect("owner")[0];
            assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", node_uid.as_str()));
            if layout == Layout::Split {
                assert!(s.spec.devices.is_none() || s.spec.shared_counters.is_none());
            }
        }
    }
}

/// The kubelet deletes a node's slices when it starts and people edit them: both are repaired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_or_edited_slices_are_repaired() {
    let api = ApiServer::start().await;
    let (_node, _daemon) = start(&api);
    let before = published(&api, Duration::from_secs(20)).await;
    let name = before[0].metadata.name.clone().unwrap();
    api.remove(&format!("resourceslices/{name}"));
    let t = Instant::now();
    let after = published(&api, Duration::from_secs(10)).await;
    assert!(after.iter().any(|s| s.metadata.name.as_deref() == Some(name.as_str())));
    println!("a deleted slice came back after {:?}", t.elapsed());
    let mut edited = api.get(&format!("resourceslices/{name}")).unwrap();
    edited["spec"]["devices"].as_array_mut().unwrap().truncate(1);
    api.insert(edited);
    eventually("the edited slice repaired")
        .within(Duration::from_secs(10))
        .every(Duration::from_millis(50))
        .until(|| {
            let s: ResourceSlice = serde_json::from_value(api.get(&format!("resourceslices/{name}")).unwrap()).unwrap();
            s.spec.devices.as_ref().map_or(0, Vec::len) > 1
        })
        .await;
}

/// Prepare through gRPC with the API server as the claim source: the claim status carries the
/// bridge's data; unprepare removes our entries and leaves other drivers' alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_writes_the_claim_status_for_the_bridge() {
    let api = ApiServer::start().await;
    let (node, mut daemon) = start(&api);
    daemon.wait_ready().await;
    let kubelet = daemon.register().await;
    let minor = node.minors()[1];
    let device = format!("gpu-{minor}-mig-3g40gb-9-4");
    let uid = "6e1c2f4a-0b7d-4c3e-8a91-1f2e3d4c5b6a";
    api.insert(claim_object(&Claim::new(uid).named("nb").device(NODE, &device)));
    let out = kubelet.prepare(Version::V1, &[claim(uid, "nb")]).await.unwrap();
    let devices = out[uid].as_ref().unwrap_or_else(|e| panic!("{e}\n{}", daemon.log()));
    assert_eq!(devices[0].device, device);
    let status = status_until(&api, "nb", |o| !o.is_empty()).await;
    let entry = &status[0];
    assert_eq!(entry["device"], device);
    assert_eq!(entry["pool"], NODE);
    assert_eq!(entry["conditions"][0]["type"], "Ready");
    assert_eq!(entry["conditions"][0]["status"], "True");
    let data = &entry["data"];
    assert!(data["migUUID"].as_str().unwrap().starts_with("MIG-"), "{data}");
    assert_eq!(data["parentMinor"], minor);
    assert_eq!(data["slurmGpuIndex"], 1);
    assert_eq!(data["slurmShards"], 4);
    assert_eq!(data["profile"], "3g.40gb");
    assert_eq!(data["placement"], json!({"start": 4, "size": 4}));
    assert!(data["gpuInstanceId"].is_u64() && data["computeInstanceId"].is_u64());
    assert!(data["parentUUID"].as_str().unwrap().starts_with("GPU-"));
    assert!(data["parentPCIBusID"].as_str().unwrap().contains(':'));

    let errors = kubelet.unprepare(Version::V1, &[claim(uid, "nb")]).await.unwrap();
    assert_eq!(errors[uid], "");
    status_until(&api, "nb", <[Value]>::is_empty).await;
}

/// `--device-names slurm`: serve publishes the whole A100 as `0002-gpu-<minor>` (Slurm
/// index 2: NVML order, no Slurm here); a claim allocated with that name prepares and its status
/// carries the name and the index; a claim whose prefix is not the GPU's index is refused with
/// Ready=False, so the bridge releases its reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_prefixed_names_are_published_prepared_and_reported() {
    let api = ApiServer::start().await;
    let node = NodeDir::new().simulate(SPEC);
    api.insert(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let kubeconfig = api.kubeconfig(node.path());
    let node = node.kubeconfig(kubeconfig);
    let mut daemon = node.serve().args(["--device-names", "slurm"]).spawn();
    let slices = published(&api, Duration::from_secs(20)).await;
    assert_eq!(slices::validate(&slices, Layout::Split), Vec::<String>::new());
    let minor = node.minors()[2];
    let device = format!("0002-gpu-{minor}");
    let names: Vec<&str> =
        slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.as_str()).collect();
    assert!(names.contains(&device.as_str()), "{names:?}");
    assert!(
        names.iter().filter(|n| n.contains("-mig-")).all(|n| n.starts_with("gpu-")),
        "dynamic partitions keep their names"
    );

    daemon.wait_ready().await;
    let kubelet = daemon.register().await;
    let uid = "22222222-0000-4000-8000-000000000001";
    api.insert(claim_object(&Claim::new(uid).named("whole").device(NODE, &device)));
    let stale = "22222222-0000-4000-8000-000000000002";
    let stale_device = format!("0001-gpu-{minor}");
    api.insert(claim_object(&Claim::new(stale).named("stale").device(NODE, &stale_device)));
    let out = kubelet.prepare(Version::V1, &[claim(uid, "whole"), claim(stale, "stale")]).await.unwrap();
    let devices = out[uid].as_ref().unwrap_or_else(|e| panic!("{e}\n{}", daemon.log()));
    assert_eq!(devices[0].device, device);
    let status = status_until(&api, "whole", |o| !o.is_empty()).await;
    assert_eq!(status[0]["device"], device);
    assert_eq!(status[0]["conditions"][0]["status"], "True");
    assert_eq!(status[0]["data"]["slurmGpuIndex"], 2);
    assert_eq!(status[0]["data"]["parentMinor"], minor);
    let refused = out[stale].clone().expect_err(stale);
    assert!(refused.contains("carries Slurm index 1, but GPU minor") && refused.contains("stale"), "{refused}");
    let status = status_until(&api, "stale", |o| !o.is_empty()).await;
    assert_eq!(status[0]["device"], stale_device);
    assert_eq!(status[0]["conditions"][0]["status"], "False");
    kubelet.unprepare(Version::V1, &[claim(uid, "whole")]).await.unwrap();
    status_until(&api, "whole", <[Value]>::is_empty).await;
}

/// Bad claims fail alone, with a precise error; a failed prepare writes Ready=False so the
/// bridge can release its Slurm reservation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_claims_fail_precisely_and_report_ready_false() {
    let api = ApiServer::start().await;
    let (node, mut daemon) = start(&api);
    daemon.wait_ready().await;
    let kubelet = daemon.register().await;
    let minor = node.minors()[0];
    let other_node = "11111111-0000-4000-8000-000000000001";
    api.insert(claim_object(
        &Claim::new(other_node).named("elsewhere").device("node-b", &format!("gpu-{minor}-mig-1g10gb-19-0")),
    ));
    let other_driver = "11111111-0000-4000-8000-000000000002";
    let nic = json!({"request": "gpu", "driver": "nic.example.com", "pool": NODE, "device": "eth0"});
    api.insert(claim_object(&Claim::new(other_driver).named("nic-only").result(nic)));
    let deleted = "11111111-0000-4000-8000-000000000003";
    let replaced = "11111111-0000-4000-8000-000000000004";
    api.insert(claim_object(&Claim::new("11111111-0000-4000-8000-000000000099").named("replaced")));
    let bad_placement = "11111111-0000-4000-8000-000000000005";
    let bad_device = format!("gpu-{minor}-mig-3g40gb-9-2");
    api.insert(claim_object(&Claim::new(bad_placement).named("bad-placement").device(NODE, &bad_device)));
    let out = kubelet
        .prepare(
            Version::V1,
            &[
                claim(other_node, "elsewhere"),
                claim(other_driver, "nic-only"),
                claim(deleted, "gone"),
                claim(replaced, "replaced"),
                claim(bad_placement, "bad-placement"),
            ],
        )
        .await
        .unwrap();
    let err = |uid: &str| out[uid].clone().expect_err(uid);
    assert!(err(other_node).contains("node-b"), "{}", err(other_node));
    assert!(err(other_driver).contains("nic.example.com"), "{}", err(other_driver));
    assert!(err(deleted).contains("not known"), "{}", err(deleted));
    assert!(err(replaced).contains("re-created"), "{}", err(replaced));
    assert!(err(bad_placement).contains("{0,4}:4"), "{}", err(bad_placement));
    let status = status_until(&api, "bad-placement", |o| !o.is_empty()).await;
    assert_eq!(status[0]["device"], bad_device);
    assert_eq!(status[0]["conditions"][0]["status"], "False");
    assert_eq!(status[0]["conditions"][0]["reason"], "PrepareFailed");
    assert!(status[0]["conditions"][0]["message"].as_str().unwrap().contains("{0,4}:4"));
    let events = api.list("/api/v1/namespaces/team-a/events");
    let event =
        events.iter().find(|e| e["involvedObject"]["name"] == "bad-placement").expect("a Warning event on the claim");
    assert_eq!((event["type"].as_str(), event["reason"].as_str()), (Some("Warning"), Some("PrepareFailed")));
    // Another node's device is that node's plugin's to report on.
    assert!(ours(&api.get("resourceclaims/team-a/elsewhere").unwrap()).is_empty());
    let v = node.layout();
    assert!(v["gpus"].as_array().unwrap().iter().all(|g| g["instances"].as_array().unwrap().is_empty()));
}

/// An API server that answers 500 for a minute: the daemon keeps serving what it can, and once
/// the server is back, slices and claim status converge by themselves. Prints the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minute_long_outage_converges_by_itself() {
    let api = ApiServer::start().await;
    let (node, mut daemon) = start(&api);
    daemon.wait_ready().await;
    let kubelet = daemon.register().await;
    let before = published(&api, Duration::from_secs(20)).await;
    let minor = node.minors()[0];
    let uid = "22222222-0000-4000-8000-000000000001";
    api.insert(claim_object(&Claim::new(uid).named("during").device(NODE, &format!("gpu-{minor}-mig-2g20gb-14-0"))));

    api.set_down(true);
    let victim = before[0].metadata.name.clone().unwrap();
    api.remove(&format!("resourceslices/{victim}"));
    let during = kubelet.prepare(Version::V1, &[claim(uid, "during")]).await.unwrap();
    assert!(during[uid].is_err(), "no claim can be read while the server is down");
    tokio::time::sleep(Duration::from_secs(60)).await;
    api.set_down(false);
    let back = Instant::now();

    // The kubelet retries; the slice comes back; the status is written.
    let prepared = eventually("a prepare once the server is back")
        .within(Duration::from_secs(60))
        .every(Duration::from_millis(200))
        .explain(|| daemon.log_tail())
        .until_async(|| async { kubelet.prepare(Version::V1, &[claim(uid, "during")]).await.unwrap()[uid].clone() })
        .await;
    assert_eq!(prepared.len(), 1);
    let slices = published(&api, Duration::from_secs(60)).await;
    assert!(slices.iter().any(|s| s.metadata.name.as_deref() == Some(victim.as_str())));
    status_until(&api, "during", |o| !o.is_empty()).await;
    println!("after a 60 s outage (500 on every request): converged {:?} after the server came back", back.elapsed());
}

/// Publishing problems show on the Node as a Warning event, and clear up by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_problems_are_reported_on_the_node() {
    use crate::support::fake_apiserver::{Fault, FaultKind};
    let api = ApiServer::start().await;
    api.fault(Fault {
        method: Some(hyper::Method::POST),
        path_contains: "resourceslices".into(),
        kind: FaultKind::Status(500),
        times: None,
    });
    let (_node, daemon) = start(&api);
    let event = eventually("an event on the Node")
        .every(Duration::from_millis(50))
        .explain(|| daemon.log_tail())
        .until(|| {
            let events = api.list("/api/v1/namespaces/default/events");
            events.into_iter().find(|e| e["involvedObject"]["kind"] == "Node")
        })
        .await;
    assert_eq!(event["reason"], "PublishFailed");
    assert_eq!(event["involvedObject"]["name"], NODE);
    // It names the server tried, and the server's own words.
    let message = event["message"].as_str().unwrap_or_default();
    assert!(message.starts_with(&format!("publishing ResourceSlices to {} failed: ", api.url())), "{message}");
    assert!(message.ends_with("injected fault: 500 (InternalError, HTTP 500)"), "{message}");
    api.clear_faults();
    published(&api, Duration::from_secs(40)).await;
}

/// One changed slice is updated in place under the same pool generation (the pool never looks
/// incomplete); a change spanning slices bumps the generation; nothing changed writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_changed_slice_keeps_the_generation() {
    use migdra::gpu::GpuBackend;
    use migdra::gpu::sim::{SimBackend, SimSpec};
    use migdra::kube::publisher::Publisher;
    use migdra::prepare::{Engine, Options as EngineOptions};
    use std::sync::Arc;
    let api = ApiServer::start().await;
    api.insert(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(SimBackend::in_memory(&SimSpec::parse("h100-80gb:4").unwrap()));
    let opts = EngineOptions::new(DRIVER, NODE, dir.path().join("state"), dir.path().join("cdi"));
    let engine = Arc::new(Engine::new(sim.clone(), opts).unwrap());
    let publisher = Publisher::new(api.client(), engine, Some(Layout::Split));
    let first = publisher.publish().await.unwrap();
    assert_eq!((first.generation, first.created), (1, 3), "2 device slices of 2 GPUs and 1 counter slice");
    let again = publisher.publish().await.unwrap();
    assert_eq!((again.created, again.updated, again.deleted), (0, 0, 0));

    // An instance appears on GPU 0: its device now carries a UUID; only the first slice changes.
    let gpus = sim.gpus().unwrap();
    let gi = sim.create_gpu_instance(&gpus[0].uuid, 9, 0).unwrap();
    sim.create_compute_instance(&gpus[0].uuid, gi.id, 2).unwrap();
    let one = publisher.publish().await.unwrap();
    assert_eq!((one.updated, one.generation), (1, 1), "updated in place, same generation");

    // Instances on GPUs of both device slices: the generation moves.
    for g in [&gpus[1], &gpus[3]] {
        let gi = sim.create_gpu_instance(&g.uuid, 19, 0).unwrap();
        sim.create_compute_instance(&g.uuid, gi.id, 0).unwrap();
    }
    let two = publisher.publish().await.unwrap();
    assert_eq!(two.generation, 2);
    let slices: Vec<ResourceSlice> =
        api.list("resourceslices").into_iter().map(|v| serde_json::from_value(v).unwrap()).collect();
    assert!(slices.iter().all(|s| s.spec.pool.generation == 2 && s.spec.pool.resource_slice_count == 3));
    assert_eq!(slices::validate(&slices, Layout::Split), Vec::<String>::new());
}
