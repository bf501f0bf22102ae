//! migdra against the kubelet's own code, not our stand-in: `migdra-kubelet` (hack/kubelet-1.36,
//! built by `hack/build-kubelet.sh`) runs the kubelet's plugin manager and DRA manager of
//! Kubernetes 1.38.0-beta.0, 1.37.2 and 1.36.3, and the CDI library a container runtime uses, each
//! against a real control plane of its own version (tests/support/controlplane.rs) and a real
//! `migdra serve` on simulated GPUs.
//!
//! What is real: registration through the plugin manager's socket watcher and its gRPC client;
//! PrepareResources / GetResources / UnprepareResources / UpdateAllocatedResourcesStatus of the DRA
//! manager with its checkpoint; the health stream; the CDI cache resolving and injecting into an
//! OCI spec, with the device metadata mount (KEP-5304). What is not: no container runtime (the spec
//! is checked, nothing runs), no pod workers (the test says when to prepare), the reconcile loop
//! for vanished pods is off, and `/dev` in the harness is a stub (its own mount namespace) with the
//! NVIDIA nodes a GPU node has.
//!
//! Run alone: `cargo test --test kubelet_code -- --show-output`.

#![allow(clippy::print_stdout)] // each scenario prints what it checked

mod support;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use migdra::gpu::sim::SimBackend;
use migdra::gpu::{SIM_CAPS_MAJOR, capability_minors};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};
use support::cluster::{apply, create_node, pool, repo};
use support::command::Run;
use support::controlplane::ControlPlane;
use support::daemon::Daemon;
use support::eventually::eventually;
use support::kubelet_code::{Build, Dirs, KUBELET_136, KUBELET_137, KUBELET_138, KubeletCode, ms_between, unix_ms};
use support::logs::{file_tail, tail};
use support::node::NodeDir;
use support::{DRIVER, NODE};

const SPEC: &str = "h100-80gb:2,a100-40gb:1:mig-off";
const NS: &str = "team-a";
const REGISTER_TIMEOUT: Duration = Duration::from_secs(30);

/// One control plane at a time: two on two cores would only slow each other down.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// SIGTERM, as the kubelet stops a pod; it must exit 0 within its grace period.
async fn terminate(serve: &mut Daemon) {
    let status = serve.terminate(Duration::from_secs(40)).await;
    assert!(status.success(), "migdra serve after SIGTERM: {status}\n{}", serve.log_tail());
}

/// The control plane, one simulated node's directories and the things running on it.
struct Env {
    client: kube::Client,
    cp: ControlPlane,
    node: NodeDir,
    bin: PathBuf,
    /// GPU minors of the node (the harness stubs their /dev nodes).
    minors: Vec<u32>,
    kubelets: u32,
}

impl Env {
    async fn start(build: Build) -> Self {
        let bin = support::kubelet_code::binary(build);
        let cp = ControlPlane::start_release(build.controlplane).await;
        println!("control plane: {} (started in {:.1?})", cp.versions, cp.startup);
        println!("kubelet code: {} ({})", bin.display(), build.module);
        let client = cp.client().await;
        create_node(&client, NODE).await;
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
        for file in ["daemonset/base/deviceclasses.yaml", "daemonset/examples/claim-templates.yaml"] {
            apply(&client, &repo().join(file), NS).await;
        }
        let node = NodeDir::new().simulate(SPEC).kubeconfig(cp.kubeconfig().to_path_buf());
        let minors = node.minors().into_iter().map(|m| m as u32).collect();
        Self { client, cp, node, bin, minors, kubelets: 0 }
    }

    fn sim_state(&self) -> PathBuf {
        self.node.sim_state()
    }

    fn cdi_dir(&self) -> PathBuf {
        self.node.cdi_dir()
    }

    /// `migdra serve` as the DaemonSet runs it, `POD_UID` set when given; once it answers.
    async fn serve(&self, pod_uid: Option<&str>) -> Daemon {
        let serve = self.node.serve().args(["--grace", "10s"]);
        match pod_uid {
            Some(uid) => serve.pod_uid(uid),
            None => serve,
        }
        .ready()
        .await
    }

    /// The kubelet code with its checkpoint in `state` (a name under the node's directory).
    fn kubelet(&mut self, state: &str) -> KubeletCode {
        self.kubelets += 1;
        let dirs =
            Dirs { registry: self.node.registry_dir(), state: self.node.path().join(state), cdi: self.cdi_dir() };
        let log = self.node.path().join(format!("kubelet-{}.log", self.kubelets));
        KubeletCode::spawn(&self.bin, self.cp.kubeconfig(), NODE, &dirs, &self.minors, log)
    }

    fn layout(&self) -> Value {
        self.node.layout()
    }

    /// (device name, MIG UUID) of every MIG instance on the node.
    fn instances(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for g in self.layout()["gpus"].as_array().unwrap() {
            for i in g["instances"].as_array().unwrap() {
                let uuid = i["compute_instances"][0]["uuid"].as_str().unwrap_or_default().to_string();
                out.push((i["device"].as_str().unwrap().to_string(), uuid));
            }
        }
        out
    }

    fn cdi_specs(&self) -> Vec<String> {
        std::fs::read_dir(self.cdi_dir())
            .map(|rd| rd.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn diagnostics(&self) -> String {
        let mut out = String::new();
        for i in 1..=self.node.daemons() {
            out.push_str(&file_tail(&format!("migdra serve #{i}"), &self.node.log_of(i), 25));
            out.push('\n');
        }
        for i in 1..=self.kubelets {
            out.push_str(&file_tail(
                &format!("migdra-kubelet #{i}"),
                &self.node.path().join(format!("kubelet-{i}.log")),
                25,
            ));
            out.push('\n');
        }
        out
    }

    /// Our complete pool (every slice of the newest generation); how long it took to be there.
    async fn pool(&self, timeout: Duration) -> (Vec<ResourceSlice>, Duration) {
        pool(&self.client, NODE, timeout, || self.diagnostics()).await
    }

    /// A pod using one claim: from a template (the scheduler places it), or a claim by name on a
    /// pod already bound to the node (as slurm-bridge binds its pods).
    async fn create_pod(&self, name: &str, template: Option<&str>, claim: Option<&str>) -> Pod {
        let source = match (template, claim) {
            (Some(t), None) => json!({"name": "gpu", "resourceClaimTemplateName": t}),
            (None, Some(c)) => json!({"name": "gpu", "resourceClaimName": c}),
            _ => unreachable!("a template or a claim"),
        };
        let mut spec = json!({
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": false,
            "resourceClaims": [source],
            "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}
            }]
        });
        if claim.is_some() {
            spec["nodeName"] = json!(NODE);
        }
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": NS}, "spec": spec})).unwrap();
        self.pods().create(&PostParams::default(), &pod).await.unwrap()
    }

    /// Wait until the scheduler binds the pod.
    async fn bound(&self, name: &str) {
        eventually(format!("pod {name} bound"))
            .within(Duration::from_secs(60))
            .every(Duration::from_millis(100))
            .explain(|| self.diagnostics())
            .until_async(move || async move {
                let pod = self.pods().get(name).await.unwrap();
                let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
                if bound { Ok(()) } else { Err(format!("{:?}", pod.status)) }
            })
            .await;
    }

    /// A claim allocated by writing its status, as slurm-bridge does: `device` of this node,
    /// reserved for `pod`.
    async fn bridge_claim(&self, name: &str, pod: &str, device: &str) -> ResourceClaim {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig"}}]}}
        }))
        .unwrap();
        self.claims().create(&PostParams::default(), &claim).await.unwrap();
        let pod = self.create_pod(pod, None, Some(name)).await;
        let status = json!({"status": {
            "allocation": {
                "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": device}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE]}
                ]}]}
            },
            "reservedFor": [{"resource": "pods", "name": pod.metadata.name, "uid": pod.metadata.uid}]
        }});
        self.claims().patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap()
    }

    /// The claim a pod's `gpu` entry resolves to.
    async fn pod_claim(&self, pod: &str) -> ResourceClaim {
        let p = self.pods().get(pod).await.unwrap();
        let spec_claim = &p.spec.as_ref().unwrap().resource_claims.as_ref().unwrap()[0];
        let name = spec_claim.resource_claim_name.clone().or_else(|| {
            p.status
                .as_ref()?
                .resource_claim_statuses
                .as_ref()?
                .iter()
                .find(|s| s.name == "gpu")?
                .resource_claim_name
                .clone()
        });
        self.claims().get(&name.unwrap_or_else(|| panic!("pod {pod} has no claim yet"))).await.unwrap()
    }

    /// Our Ready `status.devices` entry of a claim (waits for migdra's status write).
    async fn device_status(&self, claim: &str) -> Value {
        eventually(format!("a Ready status on claim {claim}"))
            .every(Duration::from_millis(100))
            .explain(|| self.diagnostics())
            .until_async(move || async move {
                let c = self.claims().get(claim).await.unwrap();
                let devices = c.status.as_ref().and_then(|s| s.devices.clone()).unwrap_or_default();
                let ready = devices.into_iter().map(|d| serde_json::to_value(&d).unwrap()).find(|v| {
                    v["driver"] == DRIVER
                        && v["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
                ready.ok_or_else(|| format!("{:?}", c.status))
            })
            .await
    }

    /// A prepare through the kubelet code that must succeed, checked down to the OCI spec: the
    /// CDI IDs resolve, and the container gets only its MIG device's nodes and its MIG UUID.
    /// Returns (device, MIG UUID).
    async fn prepared(&self, kubelet: &mut KubeletCode, pod: &str) -> (String, String) {
        let answer = kubelet.prepare(NS, pod).await;
        assert_eq!(answer["ok"], true, "prepare {pod}: {answer}\n{}", self.diagnostics());
        let claim = self.pod_claim(pod).await;
        let claim_name = claim.metadata.name.clone().unwrap();
        let uid = claim.metadata.uid.clone().unwrap();
        let device = allocated(&claim).unwrap_or_else(|| panic!("claim {claim_name} is not allocated"));
        let status = self.device_status(&claim_name).await;
        let data = &status["data"];
        let mig_uuid = data["migUUID"].as_str().unwrap_or_else(|| panic!("no migUUID in {status}")).to_string();
        let parent = data["parentMinor"].as_u64().unwrap() as u32;
        let (gi, ci) =
            (data["gpuInstanceId"].as_u64().unwrap() as u32, data["computeInstanceId"].as_u64().unwrap() as u32);

        let containers = answer["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1, "{answer}");
        let c = &containers[0];
        assert!(c.get("error").is_none() && c.get("unresolved").is_none(), "container side of {pod}: {c}");
        assert!(c.get("cdi_errors").is_none(), "the CDI library found bad specs: {}", c["cdi_errors"]);
        let ids: Vec<&str> = c["cdi_ids"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        // After a kubelet restart the DRA manager's checkpoint already lists the device, and its
        // repeated NodePrepareResources appends it again (ClaimInfo.addDevice): the kubelet then
        // passes the same CDI ID twice. That is the kubelet's own behaviour; the runtime's
        // injection must, and does, come out the same.
        let unique: BTreeSet<&str> = ids.iter().copied().collect();
        assert_eq!(
            unique.into_iter().collect::<Vec<_>>(),
            [format!("{DRIVER}/claim={uid}-{device}")],
            "GetResources of {pod}"
        );
        if ids.len() > 1 {
            println!("  {pod}: the kubelet passes its CDI ID {} times (its checkpoint held it already)", ids.len());
        }

        let nodes: Vec<(String, String, u64, u64)> = c["device_nodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| {
                (
                    n["path"].as_str().unwrap().into(),
                    n["type"].as_str().unwrap().into(),
                    n["major"].as_u64().unwrap(),
                    n["minor"].as_u64().unwrap(),
                )
            })
            .collect();
        let (gi_cap, ci_cap) = capability_minors(parent, gi, ci);
        let want: BTreeSet<String> = [
            "/dev/nvidiactl".to_string(),
            "/dev/nvidia-uvm".into(),
            "/dev/nvidia-uvm-tools".into(),
            format!("/dev/nvidia{parent}"),
            format!("/dev/nvidia-caps/nvidia-cap{gi_cap}"),
            format!("/dev/nvidia-caps/nvidia-cap{ci_cap}"),
        ]
        .into();
        let got: BTreeSet<String> = nodes.iter().map(|n| n.0.clone()).collect();
        assert_eq!(got, want, "device nodes of {pod} ({device})");
        for (path, kind, major, minor) in &nodes {
            assert_eq!(kind, "c", "{path}");
            if path.starts_with("/dev/nvidia-caps/") {
                assert_eq!(
                    (*major, *minor as u32 == gi_cap || *minor as u32 == ci_cap),
                    (u64::from(SIM_CAPS_MAJOR), true),
                    "{path}"
                );
            } else if *path == format!("/dev/nvidia{parent}") {
                assert_eq!((*major, *minor), (195, u64::from(parent)), "{path}");
            }
        }
        for other in self.minors.iter().filter(|m| **m != parent) {
            assert!(!got.contains(&format!("/dev/nvidia{other}")), "{pod} sees GPU minor {other}");
            let rules = c["cgroup_allow"].as_array().unwrap();
            assert!(
                !rules.iter().any(|r| r.as_str().unwrap().starts_with(&format!("c 195:{other} "))),
                "{pod}: {rules:?}"
            );
        }
        let env: Vec<&str> = c["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert!(env.contains(&format!("NVIDIA_VISIBLE_DEVICES={mig_uuid}").as_str()), "{env:?}");
        assert!(env.contains(&format!("CUDA_VISIBLE_DEVICES={mig_uuid}").as_str()), "{env:?}");
        let instances: Vec<_> = self.instances().into_iter().filter(|(d, _)| *d == device).collect();
        assert_eq!(instances, [(device.clone(), mig_uuid.clone())], "one instance of {device}, with the status' UUID");
        let metadata = self.metadata_in_spec(pod, &claim, c, data).await;
        println!(
            "  {pod}: claim {claim_name} → {device}, {} in {} ms; CDI {}; spec: {} nodes (parent \
             /dev/nvidia{parent} 195:{parent}, caps {gi_cap},{ci_cap} on major {SIM_CAPS_MAJOR}), \
             NVIDIA_VISIBLE_DEVICES={mig_uuid}; metadata at {metadata}",
            mig_uuid,
            answer["prepare_ms"],
            ids[0],
            nodes.len()
        );
        (device, mig_uuid)
    }

    /// The device metadata (KEP-5304) the CDI library put in the container's OCI spec: a read-only
    /// bind mount at the well-known path (under the pod's name for a template claim), of a host
    /// file that names the claim's MIG UUID, profile, placement, parent, PCI bus ID, Slurm index
    /// and shards as the claim status does. Returns the container path.
    async fn metadata_in_spec(&self, pod: &str, claim: &ResourceClaim, container: &Value, data: &Value) -> String {
        let p = self.pods().get(pod).await.unwrap();
        let entry = &p.spec.as_ref().unwrap().resource_claims.as_ref().unwrap()[0];
        let results = claim.status.as_ref().unwrap().allocation.as_ref().unwrap().devices.as_ref().unwrap();
        let request = &results.results.as_ref().unwrap()[0].request;
        let claim_name = claim.metadata.name.as_deref().unwrap();
        let dir = "/var/run/kubernetes.io/dra-device-attributes";
        let want = match entry.resource_claim_template_name {
            Some(_) => format!("{dir}/resourceclaimtemplates/{}/{request}/{DRIVER}-metadata.json", entry.name),
            None => format!("{dir}/resourceclaims/{claim_name}/{request}/{DRIVER}-metadata.json"),
        };
        let mounts = container["mounts"].as_array().unwrap_or_else(|| panic!("no mounts in {pod}'s spec: {container}"));
        let found: Vec<&Value> = mounts.iter().filter(|m| m["destination"] == want).collect();
        assert_eq!(found.len(), 1, "{pod}: one mount at {want} in {mounts:?}");
        let options: Vec<&str> = found[0]["options"].as_array().unwrap().iter().map(|o| o.as_str().unwrap()).collect();
        assert!(options.contains(&"ro") && options.contains(&"bind"), "{options:?}");
        let host = PathBuf::from(found[0]["source"].as_str().unwrap());
        let want_host =
            self.node.plugin_dir().join(format!("dra-device-metadata/{NS}_{claim_name}/{request}/metadata.json"));
        assert_eq!(host, want_host, "the KEP's host layout under the plugin directory");
        let bytes = std::fs::read(&host).unwrap_or_else(|e| panic!("{}: {e}", host.display()));
        let objs: Vec<Value> =
            serde_json::Deserializer::from_slice(&bytes).into_iter::<Value>().map(Result::unwrap).collect();
        let versions: Vec<&str> = objs.iter().map(|o| o["apiVersion"].as_str().unwrap()).collect();
        assert_eq!(versions, ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]);
        let o = &objs[0];
        assert_eq!(o["kind"], "DeviceMetadata");
        assert_eq!(o["metadata"]["uid"].as_str(), claim.metadata.uid.as_deref());
        assert_eq!(o["metadata"]["name"], claim_name);
        let d = &o["requests"][0]["devices"][0];
        let attr =
            |k: &str| d["attributes"][k].as_object().and_then(|v| v.values().next()).cloned().unwrap_or_default();
        assert_eq!((d["driver"].as_str(), d["pool"].as_str()), (Some(DRIVER), Some(NODE)));
        assert_eq!(attr("uuid"), data["migUUID"], "the created instance's MIG UUID");
        assert_eq!(attr("profile"), data["profile"]);
        assert_eq!(attr("placementStart"), data["placement"]["start"]);
        assert_eq!(attr("placementSize"), data["placement"]["size"]);
        assert_eq!(attr("parentUUID"), data["parentUUID"]);
        assert_eq!(attr("resource.kubernetes.io/pciBusID"), data["parentPCIBusID"]);
        assert_eq!(attr("slurmGpuIndex"), data["slurmGpuIndex"]);
        assert_eq!(attr("slurmShards"), data["slurmShards"]);
        want
    }

    /// The host directory of a claim's device metadata.
    fn metadata_dir(&self, claim_name: &str) -> PathBuf {
        self.node.plugin_dir().join(format!("dra-device-metadata/{NS}_{claim_name}"))
    }
}

/// Our device in a claim's allocation.
fn allocated(c: &ResourceClaim) -> Option<String> {
    let results = c.status.as_ref()?.allocation.as_ref()?.devices.as_ref()?.results.as_ref()?;
    results.iter().find(|r| r.driver == DRIVER && r.pool == NODE).map(|r| r.device.clone())
}

/// Scenario 1: the kubelet's plugin manager registers migdra; time from migdra's start.
async fn register(env: &Env, kubelet: &mut KubeletCode, serve: &Daemon, after: usize, what: &str) -> Value {
    let endpoint = serve.dra.file_name().unwrap().to_string_lossy().into_owned();
    let a = kubelet.wait_registered(DRIVER, REGISTER_TIMEOUT, after, &format!("/{endpoint}")).await;
    if a["ok"] != true {
        let log = std::fs::read_to_string(&kubelet.log).unwrap_or_default();
        let errors: Vec<&str> = log.lines().filter(|l| l.contains("RegisterPlugin error")).collect();
        let tried: Vec<String> =
            errors[errors.len().saturating_sub(3)..].iter().map(|l| l.chars().take(600).collect()).collect();
        panic!(
            "{what}: the kubelet's plugin manager did not register {DRIVER} within \
             {REGISTER_TIMEOUT:?}: {}\nits registration errors:\n{}\n{}",
            a["error"],
            tried.join("\n"),
            env.diagnostics()
        );
    }
    let at = unix_ms(&a["unix_ms"]);
    let events = a["events"].as_array().unwrap();
    let register = &events[a["index"].as_u64().unwrap() as usize];
    assert_eq!(register["endpoint"], serve.dra.display().to_string(), "{register}");
    let versions: Vec<&str> = register["versions"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(versions.contains(&"v1.DRAPlugin"), "{versions:?}");
    assert!(
        events[after..]
            .iter()
            .any(|e| e["kind"] == "validate" && e["error"].is_null() && e["endpoint"] == register["endpoint"]),
        "ValidatePlugin came first: {events:?}"
    );
    println!(
        "  {what}: registered by the plugin manager {} ms after migdra started ({} ms after the \
         kubelet code started); endpoint {}, services {versions:?}",
        ms_between(serve.started, at),
        ms_between(kubelet.spawned, at),
        serve.dra.display()
    );
    a
}

/// The health API versions of the streams migdra served, from its log, each once.
fn health_versions(serve: &Daemon) -> Vec<String> {
    let log = serve.log();
    let mut versions: Vec<String> = log
        .lines()
        .filter(|l| l.contains("health stream opened"))
        .filter_map(|l| {
            let v = l.split("version").nth(1)?;
            Some(
                v.trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
                    .split(|c: char| !c.is_ascii_alphanumeric())
                    .next()?
                    .to_string(),
            )
        })
        .collect();
    versions.sort();
    versions.dedup();
    versions
}

/// Wait for an event of this kind (and endpoint) from index `after` on.
async fn event(kubelet: &mut KubeletCode, kind: &str, endpoint: Option<&Path>, after: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = kubelet.events().await;
        let hit = events[after.min(events.len())..]
            .iter()
            .find(|e| e["kind"] == kind && endpoint.is_none_or(|p| e["endpoint"] == p.display().to_string()));
        if let Some(e) = hit {
            return e.clone();
        }
        assert!(Instant::now() < deadline, "no {kind} event for {endpoint:?} within 30 s: {events:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The health the kubelet reports for the pod's claim: (health, message) of each resource.
async fn allocated_health(kubelet: &mut KubeletCode, pod: &str) -> Vec<(String, String, String)> {
    let a = kubelet.allocated_status(NS, pod).await;
    assert_eq!(a["ok"], true, "{a}");
    let mut out = Vec::new();
    for cs in a["container_statuses"].as_array().unwrap() {
        for rs in cs["allocatedResourcesStatus"].as_array().into_iter().flatten() {
            for r in rs["resources"].as_array().into_iter().flatten() {
                out.push((
                    r["resourceID"].as_str().unwrap_or_default().to_string(),
                    r["health"].as_str().unwrap_or_default().to_string(),
                    r["message"].as_str().unwrap_or_default().to_string(),
                ));
            }
        }
    }
    out
}

/// Poll the pod's allocatedResourcesStatus until its one resource has `health`.
async fn health_becomes(
    kubelet: &mut KubeletCode,
    pod: &str,
    health: &str,
    since: Instant,
) -> (String, String, String) {
    loop {
        let h = allocated_health(kubelet, pod).await;
        if h.len() == 1 && h[0].1 == health {
            return h[0].clone();
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "{pod}: allocatedResourcesStatus not {health} after 30 s: {h:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A 3g.40gb partition on the H100 other than `avoid_minor`'s: where the bridge-style claim goes.
fn other_h100(env: &Env, avoid: &str) -> u32 {
    let layout = env.layout();
    let h100s: Vec<u32> = layout["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["mig_enabled"] == true)
        .map(|g| g["minor"].as_u64().unwrap() as u32)
        .collect();
    *h100s.iter().find(|m| !avoid.starts_with(&format!("gpu-{m}-"))).unwrap()
}

/// Scenarios 1–5 on the kubelet code of 1.38, 1.37 and 1.36: registration, prepare (scheduler
/// and bridge), re-prepare, kubelet restart, migdra restart and a rolling upgrade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_138_registers_prepares_and_survives_restarts() {
    registers_prepares_and_survives_restarts(KUBELET_138).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_137_registers_prepares_and_survives_restarts() {
    registers_prepares_and_survives_restarts(KUBELET_137).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_136_registers_prepares_and_survives_restarts() {
    registers_prepares_and_survives_restarts(KUBELET_136).await;
}

async fn registers_prepares_and_survives_restarts(build: Build) {
    let _serial = SERIAL.lock().await;
    let mut env = Env::start(build).await;

    println!("1. registration through the real plugin manager");
    let mut kubelet = env.kubelet("kubelet-state-1");
    // As on a node: the kubelet runs first and deletes the node's slices at start; then migdra's
    // DaemonSet pod starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut serve = env.serve(None).await;
    register(&env, &mut kubelet, &serve, 0, "migdra serve").await;
    // The DaemonSet's probe passes once the kubelet's own plugin manager has registered migdra.
    println!("  migdra probe: {}", env.node.probe(None).ok().trim());
    let (slices, took) = env.pool(Duration::from_secs(60)).await;
    println!("  pool complete: {} slices, {took:.1?} after registration", slices.len());

    println!("2. prepare: a pod placed by kube-scheduler, and a claim allocated by writing its status");
    env.create_pod("p-tmpl", Some("mig-1g-10gb"), None).await;
    env.bound("p-tmpl").await;
    let (tmpl_device, tmpl_uuid) = env.prepared(&mut kubelet, "p-tmpl").await;
    let bridge_device = format!("gpu-{}-mig-3g40gb-9-4", other_h100(&env, &tmpl_device));
    env.bridge_claim("bridge-3g", "p-bridge", &bridge_device).await;
    let (device, bridge_uuid) = env.prepared(&mut kubelet, "p-bridge").await;
    assert_eq!(device, bridge_device);
    assert_ne!(bridge_uuid, tmpl_uuid);

    println!("3. re-prepare: the same kubelet, then a kubelet with a new state directory");
    let count = env.instances().len();
    // The same kubelet finds the claim prepared in its cache and does not call migdra again.
    assert_eq!(env.prepared(&mut kubelet, "p-tmpl").await, (tmpl_device.clone(), tmpl_uuid.clone()));
    kubelet.kill();
    // A new state directory: the kubelet knows nothing and calls NodePrepareResources again.
    let mut kubelet = env.kubelet("kubelet-state-2");
    register(&env, &mut kubelet, &serve, 0, "a kubelet with a new state directory").await;
    assert_eq!(env.prepared(&mut kubelet, "p-tmpl").await, (tmpl_device.clone(), tmpl_uuid.clone()));
    assert_eq!(env.prepared(&mut kubelet, "p-bridge").await, (bridge_device.clone(), bridge_uuid.clone()));
    assert_eq!(env.instances().len(), count, "re-prepare made no instance: {:?}", env.instances());
    println!("  idempotent: {count} instances before and after, same MIG UUIDs");

    println!("4. kubelet restart: SIGKILL, a new one on the same directories (and p-tmpl's CDI spec deleted)");
    kubelet.kill();
    // A spec deleted behind migdra's back (by hand, a tmpfs wipe, an external cleanup): the
    // kubelet's repeated prepare must get it back, or the container could not start.
    let tmpl_uid = env.pod_claim("p-tmpl").await.metadata.uid.unwrap();
    let spec = env.cdi_dir().join(format!("{DRIVER}-claim_{tmpl_uid}.json"));
    std::fs::remove_file(&spec).unwrap();
    let mut kubelet = env.kubelet("kubelet-state-2");
    register(&env, &mut kubelet, &serve, 0, "the restarted kubelet").await;
    // Claims loaded from the kubelet's checkpoint count as not prepared: it calls migdra again.
    assert_eq!(env.prepared(&mut kubelet, "p-tmpl").await, (tmpl_device.clone(), tmpl_uuid.clone()));
    assert!(spec.exists(), "the repeated prepare did not write the deleted spec again");
    println!("  p-tmpl's deleted CDI spec was written again by the repeated prepare; the CDI library resolves it");
    // The wipe runs beside registration, in the background: under load it can come after the
    // prepare above.
    eventually("the kubelet's DRA manager deletes the node's slices at start")
        .within(Duration::from_secs(30))
        .explain(|| kubelet.log_tail(30))
        .until(|| std::fs::read_to_string(&kubelet.log).unwrap_or_default().contains("\"Deleted ResourceSlices\""))
        .await;
    let (_, took) = env.pool(Duration::from_secs(60)).await;
    println!(
        "  the restarted kubelet deleted the node's ResourceSlices at start (as kubelets do); \
         migdra's pool was complete again {took:.1?} later"
    );
    env.create_pod("p-2g", Some("mig-2g-20gb"), None).await;
    env.bound("p-2g").await;
    env.prepared(&mut kubelet, "p-2g").await;
    assert_eq!(env.instances().len(), count + 1);

    println!("5a. migdra restart: SIGTERM, start again");
    let before = kubelet.events().await.len();
    terminate(&mut serve).await;
    let dereg = event(&mut kubelet, "deregister", Some(&serve.dra), before).await;
    println!("  deregistered at {} ms (kubelet clock) once the registration socket went", dereg["ms"]);
    let after = kubelet.events().await.len();
    let mut serve = env.serve(None).await;
    register(&env, &mut kubelet, &serve, after, "restarted migdra").await;
    let p2g_claim = env.pod_claim("p-2g").await.metadata.name.unwrap();
    let a = kubelet.unprepare(NS, "p-2g").await;
    assert_eq!(a["ok"], true, "{a}\n{}", env.diagnostics());
    assert!(!env.metadata_dir(&p2g_claim).exists(), "unprepare removes the claim's device metadata");
    env.prepared(&mut kubelet, "p-2g").await;
    assert_eq!(env.prepared(&mut kubelet, "p-tmpl").await, (tmpl_device.clone(), tmpl_uuid.clone()));

    println!("5b. rolling upgrade: a second migdra (another POD_UID) before the first stops");
    let events_before = kubelet.events().await.len();
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = {
        let stop = stop.clone();
        // The kubelet keeps working through the upgrade: unprepare and prepare one pod in a loop.
        tokio::spawn(async move {
            let mut results = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for cmd in ["unprepare", "prepare"] {
                    let a = kubelet
                        .call(json!({"cmd": cmd, "namespace": NS, "pod": "p-2g"}), Duration::from_secs(60))
                        .await;
                    results.push((SystemTime::now(), cmd, a));
                }
            }
            (kubelet, results)
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let new = env.serve(Some("7b0c1e52-0000-4000-8000-00000000000b")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    terminate(&mut serve).await;
    let old_gone = SystemTime::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut kubelet, results) = cycles.await.unwrap();
    let failed: Vec<_> = results.iter().filter(|(_, _, a)| a["ok"] != true).collect();
    assert!(failed.is_empty(), "calls failed during the rolling upgrade: {failed:?}\n{}", env.diagnostics());
    let registered = event(&mut kubelet, "register", Some(&new.dra), events_before).await;
    let dereg = event(&mut kubelet, "deregister", Some(&serve.dra), events_before).await;
    let new_at = unix_ms(&registered["unix_ms"]);
    let through_new = results.iter().filter(|(t, _, _)| *t > new_at).count();
    let after_old = results.iter().filter(|(t, _, _)| *t > old_gone).count();
    assert!(
        through_new > 0 && after_old > 0,
        "calls after the new plugin registered: {through_new}, after the old one stopped: {after_old}"
    );
    println!(
        "  {} calls (unprepare+prepare of p-2g), none failed: {through_new} after the new plugin \
         registered ({} ms after it started), {after_old} after the old one stopped; old endpoint \
         deregistered at {} ms",
        results.len(),
        ms_between(new.started, new_at),
        dereg["ms"]
    );
    // Which plugin served the loop's calls, by each one's own log of them.
    let claim_uid = env.pod_claim("p-2g").await.metadata.uid.unwrap();
    let served = |log: String| log.lines().filter(|l| l.contains(&claim_uid) && l.ends_with("prepared")).count();
    let (by_old, by_new) = (served(serve.log()), served(new.log()));
    assert!(by_new > 0, "the new plugin prepared nothing:\n{}", tail(&new.log(), 20));
    println!(
        "  prepares of p-2g logged by the old plugin: {by_old} (before the upgrade too), by the new one: {by_new}"
    );
    env.prepared(&mut kubelet, "p-2g").await;
    println!("  with the old plugin gone, p-2g prepared again through {}", new.dra.display());
    drop(serve);
    drop(new);
}

/// Scenarios 6–8 on the kubelet code of 1.38, 1.37 and 1.36: health, an overlapping claim, a
/// node reboot. The 1.38 and 1.37 DRA managers stream health over v1, the 1.36 one over v1alpha1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_138_health_overlap_and_reboot() {
    health_overlap_and_reboot(KUBELET_138, "v1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_137_health_overlap_and_reboot() {
    health_overlap_and_reboot(KUBELET_137, "v1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_136_health_overlap_and_reboot() {
    health_overlap_and_reboot(KUBELET_136, "v1alpha1").await;
}

async fn health_overlap_and_reboot(build: Build, health_version: &str) {
    let _serial = SERIAL.lock().await;
    let mut env = Env::start(build).await;
    let mut kubelet = env.kubelet("kubelet-state");
    let mut serve = env.serve(None).await;
    register(&env, &mut kubelet, &serve, 0, "migdra serve").await;
    env.pool(Duration::from_secs(60)).await;
    env.create_pod("p-health", Some("mig-1g-10gb"), None).await;
    env.bound("p-health").await;
    let (device, _) = env.prepared(&mut kubelet, "p-health").await;
    let claim = env.pod_claim("p-health").await;
    let data = env.device_status(claim.metadata.name.as_deref().unwrap()).await["data"].clone();
    let parent = data["parentUUID"].as_str().unwrap().to_string();
    let gi = data["gpuInstanceId"].as_u64().unwrap() as u32;
    let sim = SimBackend::open(&env.sim_state(), None).unwrap();

    println!("6. health: XIDs reach the pod's allocatedResourcesStatus through the kubelet");
    let t = Instant::now();
    let healthy = health_becomes(&mut kubelet, "p-health", "Healthy", t).await;
    println!("  before: {healthy:?} ({:.1?} after prepare)", t.elapsed());
    sim.xid(&parent, None, 13).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let h = allocated_health(&mut kubelet, "p-health").await;
    assert_eq!(h[0].1, "Healthy", "XID 13 is the application's fault: {h:?}");
    println!("  XID 13 (application) on the parent: still Healthy after 1 s");
    let before = kubelet.events().await.len();
    let t = Instant::now();
    sim.xid(&parent, None, 48).unwrap();
    let sick = health_becomes(&mut kubelet, "p-health", "Unhealthy", t).await;
    assert!(sick.2.contains("XID 48") && sick.2.contains(&parent), "{sick:?}");
    let update = event(&mut kubelet, "health-update", None, before).await;
    let pod_uid = env.pods().get("p-health").await.unwrap().metadata.uid.unwrap();
    assert!(update["pods"].as_array().unwrap().contains(&json!(pod_uid)), "{update}");
    println!(
        "  XID 48 on the parent GPU: Unhealthy in {:.1?}, message {:?}; the DRA manager asked for \
         a status sync of the pod",
        t.elapsed(),
        sick.2
    );
    // The simulator keeps a GPU's health until it is repaired (`migdra sim health`); on NVML,
    // migdra keeps an XID in memory, so there it clears when migdra restarts.
    let t = Instant::now();
    sim.set_gpu_health(&parent, true).unwrap();
    let back = health_becomes(&mut kubelet, "p-health", "Healthy", t).await;
    println!("  GPU repaired (simulator): Healthy again in {:.1?}: {back:?}", t.elapsed());
    let t = Instant::now();
    sim.xid(&parent, Some(gi), 94).unwrap();
    let sick = health_becomes(&mut kubelet, "p-health", "Unhealthy", t).await;
    assert!(sick.2.contains("XID 94"), "{sick:?}");
    println!("  XID 94 on its GPU instance {gi}: Unhealthy in {:.1?} ({:?})", t.elapsed(), sick.2);
    let a = kubelet.unprepare(NS, "p-health").await;
    assert_eq!(a["ok"], true, "{a}");
    let (again, _) = env.prepared(&mut kubelet, "p-health").await;
    assert_eq!(again, device);
    let t = Instant::now();
    let back = health_becomes(&mut kubelet, "p-health", "Healthy", t).await;
    println!("  unprepare + prepare (a new GPU instance): Healthy in {:.1?}: {back:?}", t.elapsed());
    assert_eq!(health_versions(&serve), [health_version], "the health API the DRA manager chose");
    println!(
        "  the DRA manager streamed health over {health_version}.DRAResourceHealth (migdra advertises v1 and v1alpha1)"
    );

    println!("7. a claim that overlaps a prepared partition");
    let minor: u32 = device.trim_start_matches("gpu-").split('-').next().unwrap().parse().unwrap();
    let start: u32 = device.rsplit('-').next().unwrap().parse().unwrap();
    // A 3g.40gb (placements 0 and 4, four memory slices each) over the prepared 1g's slice.
    let overlap = format!("gpu-{minor}-mig-3g40gb-9-{}", if start >= 4 { 4 } else { 0 });
    let instances = env.instances();
    let specs = env.cdi_specs();
    let claim = env.bridge_claim("overlap", "p-overlap", &overlap).await;
    let uid = claim.metadata.uid.clone().unwrap();
    let a = kubelet.prepare(NS, "p-overlap").await;
    assert_eq!(a["ok"], false, "a claim over a prepared partition was prepared: {a}");
    let error = a["error"].as_str().unwrap();
    assert!(error.contains("ResourceClaim overlap"), "the kubelet's error names the claim: {error}");
    assert!(error.contains(&overlap) || error.contains(&device), "migdra's error names the partitions: {error}");
    assert_eq!(env.instances(), instances, "nothing created");
    assert_eq!(env.cdi_specs(), specs, "no CDI spec");
    assert!(!env.cdi_specs().iter().any(|s| s.contains(&uid)));
    let checkpoint = std::fs::read_to_string(env.node.state_dir().join("checkpoint.json")).unwrap();
    assert!(!checkpoint.contains(&uid), "migdra's checkpoint keeps the refused claim: {checkpoint}");
    let status = env.claims().get("overlap").await.unwrap().status.and_then(|s| s.devices).unwrap_or_default();
    let ready: Vec<Value> = status.iter().map(|d| serde_json::to_value(d).unwrap()["conditions"].clone()).collect();
    println!("  refused: {error}\n  nothing created, no CDI spec; claim status conditions: {ready:?}");
    let a = kubelet.unprepare(NS, "p-overlap").await;
    assert_eq!(a["ok"], true, "unprepare after a failed prepare: {a}");
    assert_eq!(env.instances(), instances);

    println!("8. a simulated reboot: everything on the node stops, the GPUs lose their instances");
    terminate(&mut serve).await;
    kubelet.kill();
    sim.reboot().unwrap();
    // /var/run (the CDI specs) is a tmpfs: a reboot empties it; /var/lib/kubelet stays.
    std::fs::remove_dir_all(env.cdi_dir()).unwrap();
    assert!(env.instances().is_empty());
    let mut kubelet = env.kubelet("kubelet-state");
    let serve = env.serve(None).await;
    register(&env, &mut kubelet, &serve, 0, "after the reboot").await;
    let (again, _) = env.prepared(&mut kubelet, "p-health").await;
    assert_eq!(again, device, "the same partition, a new instance");
    assert_eq!(env.instances().len(), 1, "{:?}", env.instances());
    println!("  prepared again after the reboot: {again}, CDI spec rewritten");
    drop(serve);
}

/// `hack/metadata-check` (Kubernetes 1.37's metadata consumer library), built into `dir` by the
/// go command from the module cache.
fn metadata_check(dir: &Path) -> PathBuf {
    let bin = dir.join("metadata-check");
    let out = Command::new("go")
        .args(["build", "-o"])
        .arg(&bin)
        .arg(".")
        .current_dir(repo().join("hack/metadata-check"))
        .env("GOTOOLCHAIN", std::env::var("GOTOOLCHAIN").unwrap_or_else(|_| "local".into()))
        .output()
        .unwrap_or_else(|e| panic!("go build in hack/metadata-check (needs Go >= 1.26 on PATH): {e}"));
    assert!(out.status.success(), "go build in hack/metadata-check failed:\n{}", String::from_utf8_lossy(&out.stderr));
    bin
}

/// Device metadata (KEP-5304) through the kubelet code and the CDI library: a template claim and a
/// claim named in the pod each get a read-only mount at the KEP's container path whose host file
/// says what the container got ([`Env::metadata_in_spec`]), and unprepare removes it. On the
/// kubelet code of 1.37, where KEP-5304 is beta (scenarios 1-9 check the mount of every claim they
/// prepare, on every release).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_137_device_metadata_reaches_the_container() {
    let _serial = SERIAL.lock().await;
    let mut env = Env::start(KUBELET_137).await;
    println!("10. device metadata in the container's OCI spec");
    let mut kubelet = env.kubelet("kubelet-state");
    let serve = env.serve(None).await;
    register(&env, &mut kubelet, &serve, 0, "migdra serve").await;
    env.pool(Duration::from_secs(60)).await;
    env.create_pod("p-meta", Some("mig-1g-10gb"), None).await;
    env.bound("p-meta").await;
    let (device, _) = env.prepared(&mut kubelet, "p-meta").await;
    let bridge = format!("gpu-{}-mig-3g40gb-9-4", other_h100(&env, &device));
    env.bridge_claim("meta-3g", "p-meta-bridge", &bridge).await;
    env.prepared(&mut kubelet, "p-meta-bridge").await;
    let check = metadata_check(env.node.path());
    for pod in ["p-meta", "p-meta-bridge"] {
        let claim = env.pod_claim(pod).await.metadata.name.unwrap();
        let files: Vec<PathBuf> = std::fs::read_dir(env.metadata_dir(&claim))
            .unwrap()
            .map(|e| e.unwrap().path().join("metadata.json"))
            .collect();
        assert_eq!(files.len(), 1, "{files:?}");
        // The consumer library of 1.37, as a workload would read the file.
        let out = Command::new(&check).arg(&files[0]).output().unwrap();
        let line = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "metadata-check {}: {line}{}",
            files[0].display(),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("  {pod}: k8s.io/dynamic-resource-allocation v0.37.2 reads it: {}", line.trim());
        let a = kubelet.unprepare(NS, pod).await;
        assert_eq!(a["ok"], true, "{a}\n{}", env.diagnostics());
        assert!(!env.metadata_dir(&claim).exists(), "unprepare of {pod} removes its claim's device metadata");
    }
    println!("  unprepare removed both claims' metadata directories");
    drop(serve);
}

/// Admin access through the kubelet code and the CDI library: a monitoring claim
/// (`adminAccess: true`) on the GPU of a prepared partition is prepared without touching any
/// instance, and the container gets the GPU and the capability nodes of the existing instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_137_admin_access_sees_the_gpu_and_its_instances() {
    let _serial = SERIAL.lock().await;
    let mut env = Env::start(KUBELET_137).await;
    println!("11. admin access in the container's OCI spec");
    let mut kubelet = env.kubelet("kubelet-state");
    let serve = env.serve(None).await;
    register(&env, &mut kubelet, &serve, 0, "migdra serve").await;
    env.pool(Duration::from_secs(60)).await;
    env.create_pod("p-worker", Some("mig-1g-10gb"), None).await;
    env.bound("p-worker").await;
    let (device, _) = env.prepared(&mut kubelet, "p-worker").await;
    let data =
        env.device_status(env.pod_claim("p-worker").await.metadata.name.as_deref().unwrap()).await["data"].clone();
    let parent = data["parentMinor"].as_u64().unwrap() as u32;
    let (gi, ci) = (data["gpuInstanceId"].as_u64().unwrap() as u32, data["computeInstanceId"].as_u64().unwrap() as u32);

    // The API server admits adminAccess only in a labelled namespace.
    let label = json!({"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}});
    Api::<Namespace>::all(env.client.clone()).patch(NS, &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "monitor", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig", "adminAccess": true}}]}}
    }))
    .unwrap();
    env.claims().create(&PostParams::default(), &claim).await.unwrap();
    let pod = env.create_pod("p-monitor", None, Some("monitor")).await;
    // Another partition of the same GPU, as the scheduler would pick a free one.
    let watched = format!("gpu-{parent}-mig-3g40gb-9-{}", if device.ends_with("-0") { 4 } else { 0 });
    let status = json!({"status": {
        "allocation": {
            "devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": watched, "adminAccess": true}
            ]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}
            ]}]}
        },
        "reservedFor": [{"resource": "pods", "name": pod.metadata.name, "uid": pod.metadata.uid}]
    }});
    env.claims().patch_status("monitor", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

    let before = env.instances();
    let answer = kubelet.prepare(NS, "p-monitor").await;
    assert_eq!(answer["ok"], true, "prepare p-monitor: {answer}\n{}", env.diagnostics());
    assert_eq!(env.instances(), before, "admin access creates and destroys nothing");
    let c = &answer["containers"][0];
    assert!(c.get("error").is_none() && c.get("cdi_errors").is_none(), "container side: {c}");
    let nodes: BTreeSet<String> =
        c["device_nodes"].as_array().unwrap().iter().map(|n| n["path"].as_str().unwrap().to_string()).collect();
    let (gi_cap, ci_cap) = capability_minors(parent, gi, ci);
    for want in [
        format!("/dev/nvidia{parent}"),
        format!("/dev/nvidia-caps/nvidia-cap{gi_cap}"),
        format!("/dev/nvidia-caps/nvidia-cap{ci_cap}"),
    ] {
        assert!(nodes.contains(&want), "{want} missing from the injected spec: {nodes:?}");
    }
    println!("  p-monitor: {watched} with admin access → the CDI library injected {nodes:?}; instances unchanged");

    let a = kubelet.unprepare(NS, "p-monitor").await;
    assert_eq!(a["ok"], true, "{a}");
    assert_eq!(env.instances(), before, "unprepare of the admin claim leaves the worker's instance");
    println!("  unprepared p-monitor: {device} still there");
    drop(serve);
}
