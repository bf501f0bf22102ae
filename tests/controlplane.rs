//! `migdra serve` against a real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler,
//! kube-controller-manager, built by `hack/build-controlplane.sh`), on simulated GPUs, with the
//! test kubelet over migdra's real sockets standing in for the kubelet that no node runs here.
//!
//! - The slices are accepted as published, in the layout of the server's version (split from
//!   1.35, combined before), with every counter intact.
//! - The real scheduler allocates pods' claims (from the ResourceClaimTemplates in daemonset/, and
//!   a claim named directly); the test kubelet prepares each bound pod's claims; every
//!   allocation is created at the allocated placement, no two overlap, and the claim status
//!   carries the MIG UUID and the Slurm index.
//! - Churn: every "unschedulable" is checked against the counter model and NVML's rules, and the
//!   placements are counted next to a best-placement baseline.
//!
//! Run alone: `cargo test --test controlplane -- --nocapture`.

#![allow(clippy::print_stdout)] // the tests report versions and figures

mod support;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use migdra::claims::ClaimRef;
use migdra::kube::slices::{self, Layout};
use migdra::kubelet::client::{TestKubelet, Version};
use migdra::mig::catalog::{self, GpuModel};
use migdra::mig::counters::{self, Counters};
use migdra::mig::fit;
use migdra::mig::naming::DeviceName;
use migdra::mig::rules::{self, Placed};
use migdra::packing::allocator::{Dev, Node, Rng};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use support::cluster::{Outcome, allocated, apply, claim_ref, create_node, ours, outcome, pool, repo};
use support::command::{Run, migdra};
use support::controlplane::{ControlPlane, K136, release_dir};
use support::daemon::Daemon;
use support::eventually::eventually;
use support::node::NodeDir;
use support::render;
use support::{DRIVER, NODE};

const SPEC: &str = "h100-80gb:2,a100-40gb:1:mig-off";
const NS: &str = "team-a";
/// The profiles the claim templates offer, and the template name of each.
const TEMPLATES: [(&str, &str); 6] = [
    ("1g.10gb", "mig-1g-10gb"),
    ("2g.20gb", "mig-2g-20gb"),
    ("3g.40gb", "mig-3g-40gb"),
    ("4g.40gb", "mig-4g-40gb"),
    ("7g.80gb", "mig-7g-80gb"),
    (WHOLE, "gpu-whole"),
];
/// A whole GPU (MIG off), in place of a profile.
const WHOLE: &str = "gpu";

/// One control plane at a time: two on two cores would only slow each other down.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A GPU of the simulated node, as `migdra layout -o json` shows it.
struct Gpu {
    minor: u32,
    model: &'static GpuModel,
    mig: bool,
    /// Device name → MIG UUID of every instance.
    instances: BTreeMap<String, String>,
}

/// The control plane, the node's simulated GPUs, `migdra serve` and the test kubelet. Fields
/// drop in this order: the daemon goes before the control plane, the files last.
struct Cluster {
    kubelet: TestKubelet,
    daemon: Daemon,
    client: kube::Client,
    cp: ControlPlane,
    node: NodeDir,
    /// Device → its `slurmGpuIndex` attribute, as published.
    slurm_index: BTreeMap<String, i64>,
    /// The slice layout for the API server's version.
    layout: Layout,
}

impl Cluster {
    /// Start everything: control plane, Node, namespace, the manifests from daemonset/, simulated
    /// GPUs, `migdra serve`, registration; waits for a complete pool.
    async fn start() -> Self {
        Self::start_with(false).await
    }

    /// [`Self::start`]; with `rbac`, first `helm install` the chart with its default values
    /// (tests/library/chart.rs shows its objects are the kustomize base's: RBAC, admission policy,
    /// DeviceClasses, Slurm index map, and the DaemonSet, which no kubelet runs here), or without
    /// helm (when not required) apply daemonset/base/rbac.yaml and admission-policy.yaml; then
    /// run `migdra serve` as its service account on `NODE` (impersonated: [`SERVICE_ACCOUNT`], its
    /// groups and the node-name extra of a pod-bound token).
    async fn start_with(rbac: bool) -> Self {
        let cp = ControlPlane::start().await;
        println!("control plane: {} (started in {:.1?})", cp.versions, cp.startup);
        let client = cp.client().await;
        let version = client.apiserver_version().await.unwrap();
        let num = |s: &str| s.trim_end_matches(|c: char| !c.is_ascii_digit()).parse::<u32>().unwrap();
        let layout = slices::layout_for(num(&version.major), num(&version.minor));
        let mut files = vec!["daemonset/base/deviceclasses.yaml"];
        if rbac {
            if let Some(helm) = render::HELM.find() {
                helm_install(&helm, &cp, &client).await;
                files.clear();
            } else {
                for file in ["daemonset/base/rbac.yaml", "daemonset/base/admission-policy.yaml"] {
                    apply(&client, &repo().join(file), NS).await;
                }
            }
        }
        create_node(&client, NODE).await;
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
        files.push("daemonset/examples/claim-templates.yaml");
        for file in files {
            apply(&client, &repo().join(file), NS).await;
        }

        let kubeconfig = if rbac { service_account_kubeconfig(&cp, NODE) } else { cp.kubeconfig().to_path_buf() };
        let node = NodeDir::new().simulate(SPEC).kubeconfig(kubeconfig);
        // A short resync, so that the windows where nothing may change cover full checks.
        let (daemon, kubelet) = node.serve().args(["--resync", RESYNC_ARG]).registered().await;
        let mut cluster = Self { kubelet, daemon, client, cp, node, slurm_index: BTreeMap::new(), layout };
        let published = cluster.published(Duration::from_secs(60)).await;
        for d in published.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
            let index = d.attributes.as_ref().and_then(|a| a.get("slurmGpuIndex")).and_then(|a| a.int);
            cluster.slurm_index.insert(d.name.clone(), index.expect("every device carries slurmGpuIndex"));
        }
        cluster
    }

    fn diagnostics(&self) -> String {
        format!("{}\n{}", self.daemon.log_tail(), self.cp.logs())
    }

    /// Our slices once the pool is complete (every slice of the newest generation is there).
    async fn published(&self, timeout: Duration) -> Vec<ResourceSlice> {
        pool(&self.client, NODE, timeout, || self.diagnostics()).await.0
    }

    fn gpus(&self) -> Vec<Gpu> {
        self.node.layout()["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| Gpu {
                minor: g["minor"].as_u64().unwrap() as u32,
                model: catalog::model(g["model"].as_str().unwrap()).unwrap(),
                mig: g["mig_enabled"].as_bool().unwrap(),
                instances: g["instances"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| {
                        let uuid = i["compute_instances"][0]["uuid"].as_str().unwrap_or_default();
                        (i["device"].as_str().unwrap().to_string(), uuid.to_string())
                    })
                    .collect(),
            })
            .collect()
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// Every device of ours allocated to a claim in the namespace: (claim, device).
    async fn allocations(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for c in self.claims().list(&ListParams::default()).await.unwrap() {
            for device in allocated(&c) {
                out.push((c.metadata.name.clone().unwrap(), device));
            }
        }
        out
    }

    /// A pod using one claim: from the template for `profile`, or the claim `claim` by name.
    async fn create_pod(&self, name: &str, profile: &str, claim: Option<&str>) {
        let source = match claim {
            Some(c) => json!({"name": "gpu", "resourceClaimName": c}),
            None => json!({"name": "gpu", "resourceClaimTemplateName": template(profile)}),
        };
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS, "labels": {"profile": profile.replace('.', "-")}},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": false,
                "resourceClaims": [source],
                "containers": [{
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]}
                }]
            }
        }))
        .unwrap();
        self.pods().create(&PostParams::default(), &pod).await.unwrap();
    }

    /// A DeviceClass of every device of another DRA driver.
    async fn create_driver_class(&self, name: &str, driver: &str) {
        let class: k8s_openapi::api::resource::v1::DeviceClass = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{driver}\"")}}]}
        }))
        .unwrap();
        Api::<k8s_openapi::api::resource::v1::DeviceClass>::all(self.client.clone())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }

    /// A pod as written for NVIDIA's device plugin: an extended resource in its limits, no claim.
    async fn create_device_plugin_pod(&self, name: &str, resource: &str) {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": false,
                "containers": [{
                    "name": "main",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {resource: "1"}}
                }]
            }
        }))
        .unwrap();
        self.pods().create(&PostParams::default(), &pod).await.unwrap();
    }

    /// Wait until the scheduler binds the pod or calls it unschedulable.
    async fn outcome(&self, name: &str, timeout: Duration) -> Outcome {
        outcome(&self.pods(), name, timeout, || self.diagnostics()).await
    }

    /// The claims a pod uses: spec.resourceClaims, named directly or generated from a template,
    /// and the one the scheduler made for its extended resources (KEP-5004).
    async fn pod_claims(&self, name: &str) -> Vec<ResourceClaim> {
        let pod = self.pods().get(name).await.unwrap();
        let extended = pod.status.as_ref().and_then(|s| s.extended_resource_claim_status.as_ref());
        let statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.clone()).unwrap_or_default();
        let mut out = Vec::new();
        for rc in pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()).into_iter().flatten() {
            let claim_name = rc
                .resource_claim_name
                .clone()
                .or_else(|| statuses.iter().find(|s| s.name == rc.name).and_then(|s| s.resource_claim_name.clone()));
            let claim_name = claim_name.unwrap_or_else(|| panic!("pod {name}: no claim for {}", rc.name));
            out.push(self.claims().get(&claim_name).await.unwrap());
        }
        if let Some(e) = extended {
            out.push(self.claims().get(&e.resource_claim_name).await.unwrap());
        }
        out
    }

    /// Act as the kubelet for a bound pod: NodePrepareResources with each claim's (namespace,
    /// name, UID); then check the hardware, the claim status and that nothing overlaps.
    /// Returns the devices prepared.
    async fn prepare(&self, pod: &str) -> Vec<String> {
        let pod_uid = self.pods().get(pod).await.unwrap().metadata.uid.unwrap();
        let claims = self.pod_claims(pod).await;
        let mut refs = Vec::new();
        let mut want = BTreeMap::new();
        for c in &claims {
            let reserved = c.status.as_ref().and_then(|s| s.reserved_for.clone()).unwrap_or_default();
            assert!(reserved.iter().any(|r| r.uid == pod_uid), "claim {:?} is not reserved for {pod}", c.metadata.name);
            let devices = allocated(c);
            assert_eq!(devices.len(), 1, "claim {:?}: {:?}", c.metadata.name, c.status);
            let r = claim_ref(c);
            want.insert(r.uid.clone(), devices[0].clone());
            refs.push(r);
        }
        let out = self.kubelet.prepare(Version::V1, &refs).await.unwrap();
        let gpus = self.gpus();
        for r in &refs {
            let device = &want[&r.uid];
            let got = out[&r.uid]
                .as_ref()
                .unwrap_or_else(|e| panic!("prepare {pod}/{}: {e}\n{}", r.name, self.diagnostics()));
            assert_eq!(got.iter().map(|d| d.device.as_str()).collect::<Vec<_>>(), [device.as_str()], "{pod}");
            // Created at exactly the allocated placement (or, for a whole GPU, nothing to create).
            let name = DeviceName::parse(device).unwrap();
            let gpu = gpus.iter().find(|g| g.minor == name.minor()).expect("the allocated GPU exists");
            let mig_uuid = match name {
                DeviceName::Mig { .. } => {
                    let uuid = gpu.instances.get(device).unwrap_or_else(|| {
                        panic!("{device} allocated to {pod} but not created; GPU has {:?}", gpu.instances)
                    });
                    assert!(uuid.starts_with("MIG-"), "{uuid}");
                    Some(uuid.clone())
                }
                DeviceName::Gpu { .. } => {
                    assert!(!gpu.mig && gpu.instances.is_empty(), "whole GPU {device} has MIG instances");
                    None
                }
            };
            self.assert_status(r, device, mig_uuid.as_deref()).await;
        }
        self.assert_no_overlap(&gpus).await;
        want.into_values().collect()
    }

    /// Our `status.devices` entry: Ready=True with the MIG UUID and the Slurm index.
    async fn assert_status(&self, r: &ClaimRef, device: &str, mig_uuid: Option<&str>) {
        let e = eventually(format!("a status for {device} on claim {}", r.name))
            .every(Duration::from_millis(100))
            .explain(|| self.diagnostics())
            .until_async(move || async move {
                let c = self.claims().get(&r.name).await.unwrap();
                ours(&c).into_iter().find(|d| d["device"] == device).ok_or_else(|| format!("{:?}", c.status))
            })
            .await;
        let condition = &e["conditions"][0];
        assert_eq!((condition["type"].as_str(), condition["status"].as_str()), (Some("Ready"), Some("True")), "{e}");
        assert_eq!(e["pool"], NODE);
        let data = &e["data"];
        assert_eq!(data["migUUID"].as_str(), mig_uuid, "{data}");
        assert_eq!(data["slurmGpuIndex"].as_i64(), Some(self.slurm_index[device]), "{data}");
    }

    /// No device is allocated twice, every GPU's allocations fit NVML's rules and the counters
    /// together, and every MIG instance on the hardware belongs to an allocation.
    async fn assert_no_overlap(&self, gpus: &[Gpu]) {
        let allocations = self.allocations().await;
        let mut seen = BTreeSet::new();
        for (claim, device) in &allocations {
            assert!(seen.insert(device.clone()), "{device} allocated twice (again to {claim}): {allocations:?}");
        }
        for gpu in gpus.iter().filter(|g| g.mig) {
            let placed = placed_on(gpu.minor, allocations.iter().map(|(_, d)| d.as_str()));
            if let Err(e) = rules::admits_set(gpu.model, &placed) {
                panic!("allocations on GPU minor {} overlap: {e}; {allocations:?}", gpu.minor);
            }
            let used: Vec<Counters> = placed.iter().map(|p| consumption(gpu.model, *p)).collect();
            assert!(
                counters::fits(&counters::CounterSet::for_model(gpu.model).capacity().clone(), &used),
                "counters over capacity: {allocations:?}"
            );
            for device in gpu.instances.keys() {
                assert!(seen.contains(device), "instance {device} on the hardware has no allocation");
            }
        }
    }

    /// Act as the kubelet when a pod ends: NodeUnprepareResources for its claims; the instances
    /// go and so do our status entries. Then delete the pod and wait until its claims are
    /// deallocated or gone.
    async fn finish(&self, pod: &str, prepared: bool) {
        let claims = self.pod_claims(pod).await;
        let refs: Vec<ClaimRef> = claims.iter().map(claim_ref).collect();
        if prepared {
            let out = self.kubelet.unprepare(Version::V1, &refs).await.unwrap();
            for r in &refs {
                assert_eq!(out[&r.uid], "", "unprepare {pod}/{}", r.name);
            }
            let gpus = self.gpus();
            for c in &claims {
                for device in allocated(c) {
                    assert!(
                        gpus.iter().all(|g| !g.instances.contains_key(&device)),
                        "{device} still exists after unprepare"
                    );
                }
                let now = self.claims().get(c.metadata.name.as_ref().unwrap()).await.unwrap();
                assert!(ours(&now).is_empty(), "our status entries stay after unprepare: {:?}", now.status);
            }
        }
        self.pods().delete(pod, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
        for r in &refs {
            eventually(format!("claim {} of deleted pod {pod} deallocated", r.name))
                .within(Duration::from_secs(30))
                .every(Duration::from_millis(100))
                .explain(|| self.diagnostics())
                .until_async(move || async move {
                    match self.claims().get_opt(&r.name).await.unwrap() {
                        None => Ok(()),
                        Some(c) if c.metadata.uid.as_deref() != Some(r.uid.as_str()) => Ok(()),
                        Some(c) if allocated(&c).is_empty() => Ok(()),
                        Some(c) => Err(format!("{:?}", c.status)),
                    }
                })
                .await;
        }
    }

    /// The scheduler says `profile` does not fit: check it against the counter model and NVML's
    /// rules over what is allocated now. `Some(device)` where it would have fit.
    async fn fits_now(&self, profile: &str) -> Option<String> {
        let allocations = self.allocations().await;
        first_fit(&self.gpus(), allocations.iter().map(|(_, d)| d.as_str()), profile)
    }
}

fn template(profile: &str) -> &'static str {
    TEMPLATES.iter().find(|(p, _)| *p == profile).map(|(_, t)| *t).expect("a template for the profile")
}

fn consumption(model: &GpuModel, p: Placed) -> Counters {
    counters::CounterSet::for_model(model).mig(model.profile(p.profile_id).unwrap(), p.start)
}

/// The MIG partitions among `devices` on the GPU with this minor.
fn placed_on<'a>(minor: u32, devices: impl IntoIterator<Item = &'a str>) -> Vec<Placed> {
    devices
        .into_iter()
        .filter_map(|d| match DeviceName::parse(d).ok()? {
            DeviceName::Mig { parent_minor, profile_id, start, .. } if parent_minor == minor => {
                Some(Placed { profile_id, start })
            }
            _ => None,
        })
        .collect()
}

/// Where `profile` would fit next to `allocated` without moving anything: the first device, in
/// GPU and placement order, by the allocator's counter model. The counter model and NVML's rules
/// must agree on every placement.
fn first_fit<'a>(gpus: &[Gpu], allocated: impl IntoIterator<Item = &'a str> + Clone, profile: &str) -> Option<String> {
    // Every candidate in GPU and placement order, with whether it is free now; the walk is the
    // crate's (fit::walk). Every placement is checked, so counters and rules are compared on all.
    let mut candidates: Vec<(String, bool)> = Vec::new();
    for gpu in gpus {
        if profile == WHOLE {
            let name = DeviceName::Gpu { minor: gpu.minor }.to_string();
            let free = !gpu.mig && !allocated.clone().into_iter().any(|d| d == name);
            candidates.push((name, free));
            continue;
        }
        if !gpu.mig {
            continue;
        }
        let Some(p) = gpu.model.profile_by_name(profile) else { continue };
        let existing = placed_on(gpu.minor, allocated.clone());
        // The crate's allocator model of this one GPU; it refuses an overlapping allocation.
        let mut node = Node::new(gpu.model, 1, 1);
        for &placed in &existing {
            node.allocate(Dev { gpu: 0, placed });
        }
        for &start in &p.placements {
            let new = Placed { profile_id: p.id, start };
            let by_counters = node.fits(Dev { gpu: 0, placed: new });
            let by_rules = rules::admits(gpu.model, &existing, new).is_ok();
            assert_eq!(
                by_counters, by_rules,
                "counters and NVML rules disagree on {profile}@{start} next to {existing:?}"
            );
            candidates.push((DeviceName::mig(gpu.minor, &p.name, p.id, start).to_string(), by_counters));
        }
    }
    fit::walk(candidates, 1, |(_, free), _| *free).pop().map(|(name, _)| name)
}

/// Best placement: could every MIG partition live now, plus one more `profile`, be laid out on
/// the node's MIG GPUs if everything could be moved? (A whole GPU needs a free MIG-off GPU.)
fn best_fit(gpus: &[Gpu], live: &[String], profile: &str) -> bool {
    if profile == WHOLE {
        return first_fit(gpus, live.iter().map(String::as_str), WHOLE).is_some();
    }
    let mig: Vec<&Gpu> = gpus.iter().filter(|g| g.mig).collect();
    let mut wanted: Vec<String> = live
        .iter()
        .filter_map(|d| match DeviceName::parse(d).ok()? {
            DeviceName::Mig { parent_minor, profile_id, .. } => {
                let g = gpus.iter().find(|g| g.minor == parent_minor)?;
                Some(g.model.profile(profile_id)?.name.clone())
            }
            DeviceName::Gpu { .. } => None,
        })
        .collect();
    wanted.push(profile.to_string());
    // Largest first; identical profiles in non-decreasing (GPU, start) order, to skip permutations.
    let size = |p: &str| mig[0].model.profile_by_name(p).map_or(0, |p| p.memory_slices * 16 + p.compute_slices);
    wanted.sort_by_key(|p| std::cmp::Reverse((size(p), p.clone())));
    let mut layout: Vec<Vec<Placed>> = vec![Vec::new(); mig.len()];
    fn search(mig: &[&Gpu], wanted: &[String], layout: &mut [Vec<Placed>], floor: (usize, u32)) -> bool {
        let Some((first, rest)) = wanted.split_first() else { return true };
        for (g, gpu) in mig.iter().enumerate().skip(floor.0) {
            let Some(p) = gpu.model.profile_by_name(first) else { continue };
            for &start in &p.placements {
                if (g, start) < floor {
                    continue;
                }
                let new = Placed { profile_id: p.id, start };
                if rules::admits(gpu.model, &layout[g], new).is_ok() {
                    layout[g].push(new);
                    let next_floor = if rest.first() == Some(first) { (g, start) } else { (0, 0) };
                    if search(mig, rest, layout, next_floor) {
                        return true;
                    }
                    layout[g].pop();
                }
            }
        }
        false
    }
    search(&mig, &wanted, &mut layout, (0, 0))
}

/// What migdra's packing model says the scheduler picks for one `profile` device: the first
/// free device of that profile whose counters fit, walking the published slices by name (1.36+)
/// and each slice's devices in published order. `None` for a whole GPU (not modelled) or no fit.
fn model_choice(published: &[ResourceSlice], gpus: &[Gpu], allocated: &[String], profile: &str) -> Option<String> {
    use migdra::packing::allocator::{SliceOrder, first_fit};
    let (node, mig) = model_node(gpus, allocated);
    let model = node.model();
    let p = model.profile_by_name(profile)?;
    let dev = |name: &str| model_dev(&mig, name);
    let mut slices: Vec<&ResourceSlice> = published.iter().collect();
    slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let order: Vec<Vec<Dev>> =
        slices.iter().map(|s| s.spec.devices.iter().flatten().filter_map(|d| dev(&d.name)).collect()).collect();
    let chosen = first_fit(&node, &order, p.id, SliceOrder::ByName, &mut Rng::new(1))?;
    Some(DeviceName::mig(mig[chosen.gpu], &p.name, p.id, chosen.placed.start).to_string())
}

/// The packing model of the node's MIG GPUs (one slice, as published: both H100s fit in one)
/// with `allocated` taken, and the minor of each of its GPUs.
fn model_node(gpus: &[Gpu], allocated: &[String]) -> (Node<'static>, Vec<u32>) {
    let mig: Vec<u32> = gpus.iter().filter(|g| g.mig).map(|g| g.minor).collect();
    let model = gpus.iter().find(|g| g.mig).expect("a MIG GPU").model;
    let mut node = Node::new(model, mig.len(), mig.len());
    for d in allocated.iter().filter_map(|n| model_dev(&mig, n)) {
        node.allocate(d);
    }
    (node, mig)
}

/// A partition's name as the model's device, on the GPU of that minor in `mig`.
fn model_dev(mig: &[u32], name: &str) -> Option<Dev> {
    match DeviceName::parse(name).ok()? {
        DeviceName::Mig { parent_minor, profile_id, start, .. } => {
            Some(Dev { gpu: mig.iter().position(|m| *m == parent_minor)?, placed: Placed { profile_id, start } })
        }
        DeviceName::Gpu { .. } => None,
    }
}

/// A quantity as a number in its base unit (bytes, or a count), read by the crate's own parser.
fn quantity(q: &str) -> u128 {
    q.parse::<migdra::mig::devices::Quantity>().unwrap_or_else(|e| panic!("{e}")).base()
}

/// Counter name → amount in base units, from the API's counters.
fn server_counters(c: &BTreeMap<String, k8s_openapi::api::resource::v1::Counter>) -> BTreeMap<String, u128> {
    c.iter().map(|(k, v)| (k.clone(), quantity(&v.value.0))).collect()
}

/// The model's counters in the same units.
fn model_counters(c: &Counters) -> BTreeMap<String, u128> {
    c.iter().map(|(k, &v)| (k.clone(), quantity(&slices::counter_quantity(k, v).0))).collect()
}

/// One counter set's amounts, as the crate's pool reads a device.
struct Uses<'a>(&'a str, &'a BTreeMap<String, u128>);

impl fit::Consumer for Uses<'_> {
    fn consumes(&self) -> Vec<(&str, &str, Option<u128>)> {
        self.1.iter().map(|(c, &v)| (self.0, c.as_str(), Some(v))).collect()
    }
}

/// Whether `b` fits beside `a` in the counter set `set` as the server holds it, by the crate's
/// one rule ([`fit::Pool`]).
fn fits_server(
    set: &str,
    capacity: &BTreeMap<String, u128>,
    a: &BTreeMap<String, u128>,
    b: &BTreeMap<String, u128>,
) -> bool {
    let counters = capacity.iter().map(|(k, &v)| (k.clone(), Some(v))).collect();
    let mut pool = fit::Pool::new(BTreeMap::from([(set.to_string(), counters)]));
    pool.take(&Uses(set, a));
    pool.fits(&Uses(set, b))
}

/// Slices as the real API server stored them: the layout of its version, accepted, every counter
/// field intact, and the counters read back refuse every pair of placements NVML refuses.
async fn check_slices(cluster: &Cluster) {
    let slices = cluster.published(Duration::from_secs(30)).await;
    assert_eq!(slices::validate(&slices, cluster.layout), Vec::<String>::new());
    if cluster.layout == Layout::Split {
        for s in &slices {
            assert!(
                s.spec.devices.is_none() || s.spec.shared_counters.is_none(),
                "split layout: {:?}",
                s.metadata.name
            );
        }
    }
    let gpus = cluster.gpus();
    let sets: BTreeMap<String, BTreeMap<String, u128>> = slices
        .iter()
        .flat_map(|s| s.spec.shared_counters.iter().flatten())
        .map(|cs| (cs.name.clone(), server_counters(&cs.counters)))
        .collect();
    let devices: Vec<&k8s_openapi::api::resource::v1::Device> =
        slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect();
    let mig_gpus: Vec<&Gpu> = gpus.iter().filter(|g| g.mig).collect();
    assert_eq!(sets.len(), mig_gpus.len(), "one counter set per MIG GPU: {:?}", sets.keys());
    let mut pairs = 0;
    for gpu in &mig_gpus {
        let set = counters::counter_set_name(gpu.minor);
        assert_eq!(
            sets[&set],
            model_counters(&counters::CounterSet::for_model(gpu.model).capacity().clone()),
            "counter set {set}"
        );
        let mut mine = Vec::new();
        for p in &gpu.model.profiles {
            for &start in &p.placements {
                let name = DeviceName::mig(gpu.minor, &p.name, p.id, start).to_string();
                let d = devices.iter().find(|d| d.name == name).unwrap_or_else(|| panic!("{name} not published"));
                let consumes =
                    d.consumes_counters.as_ref().unwrap_or_else(|| panic!("{name}: consumesCounters dropped"));
                assert_eq!(consumes.len(), 1, "{name}");
                assert_eq!(consumes[0].counter_set, set, "{name}");
                let used = server_counters(&consumes[0].counters);
                assert_eq!(used, model_counters(&counters::CounterSet::for_model(gpu.model).mig(p, start)), "{name}");
                mine.push((Placed { profile_id: p.id, start }, used));
            }
        }
        for (i, (a, ua)) in mine.iter().enumerate() {
            for (b, ub) in &mine[i + 1..] {
                let nvml = rules::admits_set(gpu.model, &[*a, *b]).is_ok();
                assert_eq!(fits_server(&set, &sets[&set], ua, ub), nvml, "{a:?} with {b:?} on minor {}", gpu.minor);
                pairs += 1;
            }
        }
    }
    for gpu in gpus.iter().filter(|g| !g.mig) {
        let name = DeviceName::Gpu { minor: gpu.minor }.to_string();
        let d = devices.iter().find(|d| d.name == name).unwrap_or_else(|| panic!("{name} not published"));
        assert!(d.consumes_counters.is_none(), "a MIG-off GPU consumes no counters");
    }
    assert_eq!(devices.len(), 25 * 2 + 1, "every H100 partition and the whole A100");
    assert!(!cluster.daemon.log().contains("dropped"), "{}", cluster.daemon.log());
    println!(
        "slices: {} slices ({} layout, generation {}), {} devices, {} counter sets read back intact; \
         {pairs} placement pairs: the server's counters admit exactly the pairs NVML does",
        slices.len(),
        cluster.layout.as_str(),
        slices[0].spec.pool.generation,
        devices.len(),
        sets.len()
    );
}

/// The daemons' `--resync` in this file, and a window where nothing may change that covers two
/// full resyncs (a rewrite loop on resync would otherwise slip between them).
const RESYNC_ARG: &str = "1s";
const QUIET: Duration = Duration::from_millis(2500);

/// Once published and caught up, the slices stay as they are while nothing changes: migdra and
/// the API server agree on every field, so there is no rewrite loop.
async fn check_slices_stay_put(cluster: &Cluster) {
    let versions = |slices: &[ResourceSlice]| -> BTreeMap<String, String> {
        slices
            .iter()
            .map(|s| (s.metadata.name.clone().unwrap(), s.metadata.resource_version.clone().unwrap()))
            .collect()
    };
    // The first window may catch one rewrite that is due (a prepare since the last round made an
    // instance whose UUID the next full check publishes); a second one may not.
    let mut before = versions(&cluster.published(Duration::from_secs(30)).await);
    for window in 1..=2 {
        tokio::time::sleep(QUIET).await;
        let after = versions(&cluster.published(Duration::from_secs(30)).await);
        if after == before {
            return;
        }
        assert!(window < 2, "migdra keeps rewriting its slices while nothing changes\n{}", cluster.diagnostics());
        before = after;
    }
}

/// Paths where two JSON values differ, at most `limit`.
fn differences(path: &str, a: &Value, b: &Value, out: &mut Vec<String>, limit: usize) {
    if out.len() >= limit || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                differences(
                    &format!("{path}.{k}"),
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                    out,
                    limit,
                );
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                let key = u.get("name").and_then(Value::as_str).map_or_else(|| i.to_string(), str::to_string);
                differences(&format!("{path}[{key}]"), u, v, out, limit);
            }
        }
        _ => out.push(format!("{path}: published {a}, stored {b}")),
    }
}

/// The API server stores migdra's slices exactly as published: every field migdra compares
/// when it looks for drift comes back as sent. (A quantity the server canonicalizes, such as
/// `40960Mi` stored as `40Gi`, looks like drift: the publisher then rewrites that slice at
/// every resync, and the write is a no-op on the server.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_read_back_exactly_as_published() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start().await;
    let stored = cluster.published(Duration::from_secs(30)).await;
    let dry_run = migdra()
        .args(["slices", "-o", "json", "--node-name", NODE, "--slice-layout", cluster.layout.as_str(), "--sim-state"])
        .arg(cluster.node.sim_state())
        .args(["--generation", &stored[0].spec.pool.generation.to_string()])
        .json();
    let mut diff = Vec::new();
    for want in dry_run["items"].as_array().unwrap() {
        let name = want["metadata"]["name"].as_str().unwrap();
        let have = stored.iter().find(|s| s.metadata.name.as_deref() == Some(name)).expect("every slice stored");
        differences(&format!("{name}.spec"), &want["spec"], &serde_json::to_value(&have.spec).unwrap(), &mut diff, 10);
    }
    assert!(diff.is_empty(), "the API server stored other values than migdra published:\n{}", diff.join("\n"));
    println!("slices read back exactly as published: {} slices", stored.len());
    lean_reads_agree(&cluster.cp.client().await).await;
}

/// `usage` and `why` read slices in the API server's protobuf encoding (`wire::protobuf`, field
/// numbers written by hand): what they read there must be what they read from its JSON, device
/// by device, attributes, capacities, counters and taints included.
async fn lean_reads_agree(client: &kube::Client) {
    use migdra::cluster::wire;
    let path = "/apis/resource.k8s.io/v1/resourceslices";
    let text = client.request_text(http::Request::get(path).body(vec![]).unwrap()).await.unwrap();
    let json = serde_json::from_str::<wire::List<wire::Slice>>(&text).unwrap().items;
    let request =
        http::Request::get(path).header("Accept", wire::protobuf::MEDIA_TYPE).body(kube::client::Body::empty());
    let response = client.send(request.unwrap()).await.unwrap();
    let media = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_string());
    assert_eq!(media.as_deref(), Some(wire::protobuf::MEDIA_TYPE), "the API server answers in protobuf");
    let protobuf = wire::protobuf::items(&response.into_body().collect_bytes().await.unwrap()).unwrap();
    assert!(!json.is_empty());
    let devices = json.iter().map(|s| s.spec.devices.len()).sum::<usize>();
    let taints = json.iter().flat_map(|s| &s.spec.devices).map(|d| d.taints.len()).sum::<usize>();
    for (j, p) in json.iter().zip(&protobuf) {
        assert_eq!(p, j, "slice of pool {}: protobuf, then JSON", j.spec.pool.name);
    }
    assert_eq!(protobuf.len(), json.len(), "slices in protobuf and in JSON");
    println!(
        "usage's and why's protobuf read agrees with the JSON: {} slices, {devices} devices, {taints} taints",
        json.len()
    );
}

/// Slices intact on the real server; pods through the real scheduler and the resourceclaim
/// controller; each bound pod prepared by the test kubelet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_scheduler_allocates_and_migdra_prepares() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let cluster = Cluster::start().await;
    check_slices(&cluster).await;
    check_slices_stay_put(&cluster).await;

    // A claim named directly by a pod, with the 3g.40gb template's spec.
    let t: ResourceClaimTemplate = Api::namespaced(cluster.client.clone(), NS).get(template("3g.40gb")).await.unwrap();
    let direct: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "direct-3g", "namespace": NS},
        "spec": serde_json::to_value(&t.spec.expect("a template spec").spec).unwrap()
    }))
    .unwrap();
    cluster.claims().create(&PostParams::default(), &direct).await.unwrap();

    let pods = [
        ("p-1g", "1g.10gb", None),
        ("p-2g", "2g.20gb", None),
        ("p-3g", "3g.40gb", None),
        ("p-4g", "4g.40gb", None),
        ("p-7g", "7g.80gb", None),
        ("p-direct-3g", "3g.40gb", Some("direct-3g")),
        ("p-whole", WHOLE, None),
    ];
    let mut bound = Vec::new();
    let mut pending = Vec::new();
    for (name, profile, claim) in pods {
        cluster.create_pod(name, profile, claim).await;
        match cluster.outcome(name, Duration::from_secs(60)).await {
            Outcome::Bound => {
                let devices = cluster.prepare(name).await;
                println!("{name:12} {profile:8} bound, prepared {devices:?}");
                bound.push(name);
            }
            Outcome::Unschedulable(message) => {
                assert!(message.contains("claim"), "{name}: not a DRA refusal: {message}");
                let fit = cluster.fits_now(profile).await;
                assert_eq!(
                    fit, None,
                    "{name}: scheduler says {profile} does not fit ({message}), but it fits at {fit:?}"
                );
                println!("{name:12} {profile:8} unschedulable, and truly fits nowhere: {message}");
                pending.push((name, profile));
            }
        }
    }
    assert!(bound.len() >= 5, "most of these fit on two H100s and an A100: bound {bound:?}");
    assert!(bound.contains(&"p-whole"), "the A100 is free for the whole-GPU pod");
    // The pod that names a claim directly got that claim, not one made from a template.
    if bound.contains(&"p-direct-3g") {
        check_direct_claim(&cluster).await;
    }

    // The kubelet ends every MIG pod: claims are deallocated, and the pending pods get their turn.
    for name in bound.iter().filter(|n| **n != "p-whole") {
        cluster.finish(name, true).await;
    }
    for (name, profile) in &pending {
        // Waits for the binding itself: the pod's Unschedulable condition is from before the
        // others ended, and `outcome` would return it at once.
        if !cluster.outcome_bound_within(name, Duration::from_secs(90)).await {
            panic!("{name} still unschedulable on empty GPUs\n{}", cluster.diagnostics())
        }
        if *name == "p-direct-3g" {
            check_direct_claim(&cluster).await;
        }
        let devices = cluster.prepare(name).await;
        println!("{name:12} {profile:8} bound once the others ended, prepared {devices:?}");
    }
    for (name, _) in &pending {
        cluster.finish(name, true).await;
    }
    cluster.finish("p-whole", true).await;
    device_plugin_style_pod(&cluster).await;
    let left: usize = cluster.gpus().iter().map(|g| g.instances.len()).sum();
    assert_eq!(left, 0, "MIG instances left after every pod ended");
    println!("scheduling scenario done in {:.1?} (control plane start included)", t0.elapsed());
}

/// Kubernetes' standard attributes (`resource.kubernetes.io/pcieRoot`, `numaNode`) on every device
/// of a GPU, as the simulated board places them, used by the real scheduler: a claim aligns a
/// MIG slice with a NIC of another driver under one PCIe root, or asks for a NUMA node; migdra
/// prepares its own device of a claim that holds another driver's too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_attributes_align_a_mig_slice_with_another_drivers_nic() {
    use migdra::mig::devices::{NUMA_NODE, PCIE_ROOT};
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start().await;
    // Each GPU's devices carry its root and node; the GPUs' roots differ.
    let mut roots: BTreeMap<u32, (String, i64)> = BTreeMap::new();
    let published = cluster.published(Duration::from_secs(30)).await;
    for d in published.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
        let a = d.attributes.as_ref().expect("attributes");
        let root =
            a.get(PCIE_ROOT).and_then(|v| v.string.clone()).unwrap_or_else(|| panic!("{} has no pcieRoot", d.name));
        let node = a.get(NUMA_NODE).and_then(|v| v.int).unwrap_or_else(|| panic!("{} has no numaNode", d.name));
        let minor = DeviceName::parse(&d.name).unwrap().minor();
        let first = roots.entry(minor).or_insert_with(|| (root.clone(), node));
        assert_eq!(*first, (root, node), "{}: every device of GPU {minor} has its GPU's", d.name);
    }
    let distinct: BTreeSet<&String> = roots.values().map(|(r, _)| r).collect();
    assert_eq!(distinct.len(), roots.len(), "one root per GPU: {roots:?}");
    // The NIC goes under the H100 whose partitions come second in the slices, so that the
    // scheduler's first fit alone would not land there.
    let first = published.iter().flat_map(|s| s.spec.devices.iter().flatten()).find(|d| d.name.contains("-mig-"));
    let first = DeviceName::parse(&first.expect("MIG partitions published").name).unwrap().minor();
    let gpus = cluster.gpus();
    let h100 = gpus.iter().find(|g| g.mig && g.minor != first).map(|g| g.minor).expect("a second H100 with MIG on");
    let a100 = gpus.iter().find(|g| !g.mig).map(|g| g.minor).expect("the A100, MIG off");
    println!("topology (minor: root, NUMA node): {roots:?}");

    // A NIC driver's slice on the same node: one NIC under that H100's root, one under none of ours.
    let nic_root = roots[&h100].0.clone();
    cluster.create_driver_class("nic", "nic.example.com").await;
    let nic = |name: &str, root: &str| json!({"name": name, "attributes": {PCIE_ROOT: {"string": root}}});
    let nics: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "nics"},
        "spec": {
            "driver": "nic.example.com", "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [nic("nic-aligned", &nic_root), nic("nic-elsewhere", "pci0000:00")]
        }
    }))
    .unwrap();
    Api::<ResourceSlice>::all(cluster.client.clone()).create(&PostParams::default(), &nics).await.unwrap();

    // nic: a NIC (by name, or any); mig: a 1g.10gb slice; both under one root.
    let claim = |name: &str, nic_selector: Option<&str>| {
        let selectors = nic_selector.map_or(json!([]), |e| json!([{"cel": {"expression": e}}]));
        serde_json::from_value::<ResourceClaim>(json!({
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {
                "requests": [
                    {"name": "nic", "exactly": {"deviceClassName": "nic", "selectors": selectors}},
                    {"name": "mig", "exactly": {"deviceClassName": "mig-1g.10gb"}}
                ],
                "constraints": [{"requests": ["nic", "mig"], "matchAttribute": PCIE_ROOT}]
            }}
        }))
        .unwrap()
    };
    // One device by class and a NUMA node.
    let on_node = |name: &str, class: &str, node: i64| {
        let expression = format!("device.attributes[\"resource.kubernetes.io\"].numaNode == {node}");
        serde_json::from_value::<ResourceClaim>(json!({
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": class, "selectors": [{"cel": {"expression": expression}}]
            }}]}}
        }))
        .unwrap()
    };
    let h100_node = roots[&h100].1;
    let a100_node = roots[&a100].1;
    assert_ne!(h100_node, a100_node, "the board puts the A100 on another node than the H100s: {roots:?}");
    let cases = [
        (claim("aligned", None), true),
        (claim("misaligned", Some("device.attributes['resource.kubernetes.io'].pcieRoot == 'pci0000:00'")), false),
        (on_node("whole-on-a100-node", WHOLE, a100_node), true),
        (on_node("mig-on-a100-node", "mig-1g.10gb", a100_node), false),
    ];
    for (c, fits) in cases {
        let name = c.metadata.name.clone().unwrap();
        cluster.claims().create(&PostParams::default(), &c).await.unwrap();
        let pod = format!("p-{name}");
        cluster.create_pod(&pod, "topology", Some(&name)).await;
        match cluster.outcome(&pod, Duration::from_secs(60)).await {
            Outcome::Bound => assert!(fits, "{pod} bound, but nothing fits it\n{}", cluster.diagnostics()),
            Outcome::Unschedulable(m) => {
                assert!(!fits, "{pod}: unschedulable ({m})\n{}", cluster.diagnostics());
                println!("{pod:24} unschedulable, as it must be: {m}");
                cluster.finish(&pod, false).await;
                continue;
            }
        }
        let c = cluster.claims().get(&name).await.unwrap();
        let results = c.status.as_ref().and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
        let results = results.and_then(|d| d.results.clone()).unwrap_or_default();
        let ours = allocated(&c);
        assert_eq!(ours.len(), 1, "{name}: {results:?}");
        let minor = DeviceName::parse(&ours[0]).unwrap().minor();
        if name == "aligned" {
            let nic = results.iter().find(|r| r.driver == "nic.example.com").expect("a NIC allocated");
            assert_eq!((nic.device.as_str(), minor), ("nic-aligned", h100), "{name}: {results:?}");
        } else {
            assert_eq!(minor, a100, "{name}: {results:?}");
        }
        // The kubelet asks each driver for its claim: migdra prepares its own device only.
        let r = claim_ref(&c);
        let out = cluster.kubelet.prepare(Version::V1, std::slice::from_ref(&r)).await.unwrap();
        let got = out[&r.uid].as_ref().unwrap_or_else(|e| panic!("prepare {name}: {e}\n{}", cluster.diagnostics()));
        assert_eq!(got.iter().map(|d| d.device.as_str()).collect::<Vec<_>>(), [ours[0].as_str()], "{name}");
        println!("{pod:24} bound: {} (root {}, node {}), prepared", ours[0], roots[&minor].0, roots[&minor].1);
        cluster.finish(&pod, true).await;
    }
}

/// DRA preemption (KEP-5690) is not in these releases: the scheduler's DRA plugin cannot tell
/// preemption what evicting a claim's holder would free, so a higher-priority MIG pod waits and
/// no lower-priority holder is evicted. Pinned so that the release where it changes says so:
/// then migdra's part (the victim's claim unprepared, the newcomer's partition prepared, no
/// counter left held) is to be tested and timed here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_pod_does_not_preempt_a_mig_holder() {
    use k8s_openapi::api::scheduling::v1::PriorityClass;
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start().await;
    let classes = Api::<PriorityClass>::all(cluster.client.clone());
    for (name, value) in [("low", 10), ("high", 1_000_000)] {
        let pc = serde_json::from_value(json!({"metadata": {"name": name}, "value": value})).unwrap();
        classes.create(&PostParams::default(), &pc).await.unwrap();
    }
    let pod = |name: &str, priority: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "priorityClassName": priority,
                "terminationGracePeriodSeconds": 0,
                "automountServiceAccountToken": false,
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template("7g.80gb")}],
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"claims": [{"name": "gpu"}]}}]
            }
        }))
        .unwrap()
    };
    // Both H100s held whole by 7g.80gb slices of low priority.
    let low = ["p-low-0", "p-low-1"];
    for name in low {
        cluster.pods().create(&PostParams::default(), &pod(name, "low")).await.unwrap();
        assert!(matches!(cluster.outcome(name, Duration::from_secs(60)).await, Outcome::Bound), "{name}");
        cluster.prepare(name).await;
    }
    cluster.pods().create(&PostParams::default(), &pod("p-high", "high")).await.unwrap();
    let Outcome::Unschedulable(message) = cluster.outcome("p-high", Duration::from_secs(60)).await else {
        panic!("p-high bound while both H100s are held: preemption or an overlap?\n{}", cluster.diagnostics())
    };
    // Preemption would nominate the node and delete a holder within a few scheduling cycles.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let high = cluster.pods().get("p-high").await.unwrap();
    let nominated = high.status.as_ref().and_then(|s| s.nominated_node_name.clone());
    assert_eq!(nominated, None, "p-high was nominated for preemption: DRA preemption has arrived");
    for name in low {
        let p = cluster.pods().get(name).await.unwrap();
        assert!(p.metadata.deletion_timestamp.is_none(), "{name} is being evicted for p-high");
    }
    println!("p-high (priority 1000000) waits, the two holders (priority 10) stay: {message}");
    cluster.finish("p-high", false).await;
    for name in low {
        cluster.finish(name, true).await;
    }
}

/// The pod `p-direct-3g` uses the claim `direct-3g` it names: allocated 3g.40gb and reserved
/// for that pod.
async fn check_direct_claim(cluster: &Cluster) {
    let claims = cluster.pod_claims("p-direct-3g").await;
    let names: Vec<_> = claims.iter().map(|c| c.metadata.name.clone().unwrap_or_default()).collect();
    assert_eq!(names, ["direct-3g"], "the pod names exactly that claim");
    let status = claims[0].status.as_ref().expect("an allocated claim has a status");
    let allocation = status.allocation.as_ref().expect("direct-3g allocated");
    let results = allocation.devices.as_ref().and_then(|d| d.results.clone()).unwrap_or_default();
    assert!(!results.is_empty() && results.iter().all(|r| r.device.contains("-mig-3g40gb-")), "{results:?}");
    let reserved: Vec<_> = status.reserved_for.iter().flatten().map(|r| r.name.as_str()).collect();
    assert_eq!(reserved, ["p-direct-3g"]);
}

/// A pod written for NVIDIA's device plugin (mixed strategy), unchanged: `nvidia.com/mig-1g.10gb: 1`
/// in its limits and no claim. The DeviceClass from daemonset/base/deviceclasses.yaml names that
/// extended resource, so the scheduler makes and allocates a claim for it (KEP-5004); migdra
/// creates the instance, and the generated claim's status carries the MIG UUID and the Slurm
/// index.
async fn device_plugin_style_pod(cluster: &Cluster) {
    let version = &cluster.cp.versions.apiserver;
    if cluster.cp.versions.minor() < 36 {
        // DRAExtendedResource is alpha and off before 1.36; README promises such pods from 1.36.
        println!("device-plugin-style pod: not on {version} (DRAExtendedResource is alpha and off before 1.36)");
        return;
    }
    cluster.create_device_plugin_pod("p-device-plugin", "nvidia.com/mig-1g.10gb").await;
    match cluster.outcome("p-device-plugin", Duration::from_secs(60)).await {
        Outcome::Bound => {}
        Outcome::Unschedulable(m) => panic!("the device-plugin pod is unschedulable: {m}\n{}", cluster.diagnostics()),
    }
    let claims = cluster.pod_claims("p-device-plugin").await;
    assert_eq!(claims.len(), 1, "one claim made for the extended resource: {claims:?}");
    let claim = &claims[0];
    let annotations = claim.metadata.annotations.clone().unwrap_or_default();
    assert!(
        annotations.contains_key("resource.kubernetes.io/extended-resource-claim"),
        "the scheduler's extended-resource claim: {:?}",
        claim.metadata
    );
    let devices = cluster.prepare("p-device-plugin").await;
    assert_eq!(devices.len(), 1);
    assert!(devices[0].contains("-mig-1g10gb-"), "a 1g.10gb partition: {devices:?}");
    let c = cluster.claims().get(claim.metadata.name.as_ref().unwrap()).await.unwrap();
    let data = &ours(&c)[0]["data"];
    println!(
        "p-device-plugin  nvidia.com/mig-1g.10gb: 1 -> claim {} device {} {} (Slurm GPU index {}, {} shard(s))",
        claim.metadata.name.as_deref().unwrap_or_default(),
        devices[0],
        data["migUUID"],
        data["slurmGpuIndex"],
        data["slurmShards"]
    );
    cluster.finish("p-device-plugin", true).await;
}

/// The daemonset's service account, as its token authenticates it.
const SERVICE_ACCOUNT: &str = "system:serviceaccount:migdra-system:migdra";
const SERVICE_ACCOUNT_GROUPS: [&str; 3] =
    ["system:serviceaccounts", "system:serviceaccounts:migdra-system", "system:authenticated"];
/// The user extra a pod-bound service-account token carries (1.32+).
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// `helm install` of the chart as daemonset/README.md says (its own namespace, created by Helm),
/// into the control plane as its admin; then every object `helm template` renders is there.
async fn helm_install(helm: &std::path::Path, cp: &ControlPlane, client: &kube::Client) {
    let t = Instant::now();
    let home = tempfile::tempdir().unwrap();
    let kubeconfig = cp.kubeconfig().to_str().unwrap();
    let args = ["install", render::RELEASE, render::CHART, "-n", render::NAMESPACE, "--create-namespace"];
    let out = std::process::Command::new(helm)
        .args(args)
        .args(["--kubeconfig", kubeconfig])
        .current_dir(repo())
        // Helm's own cache and configuration stay out of the user's home.
        .env("HELM_CACHE_HOME", home.path())
        .env("HELM_CONFIG_HOME", home.path())
        .env("HELM_DATA_HOME", home.path())
        .output()
        .unwrap();
    let what = format!("helm {}", args.join(" "));
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    let docs = render::documents("helm template", &render::helm_template(helm, &[]));
    let missing = support::cluster::missing(client, "helm template", &docs, render::NAMESPACE).await;
    assert!(missing.is_empty(), "{what} succeeded, but the API server lacks {missing:?}");
    println!("{what}: the API server holds all {} objects of the chart ({:.1?})", docs.len(), t.elapsed());
}

/// A kubeconfig that acts as migdra's service account in a pod on `node`.
fn service_account_kubeconfig(cp: &ControlPlane, node: &str) -> PathBuf {
    cp.impersonating_kubeconfig(SERVICE_ACCOUNT, &SERVICE_ACCOUNT_GROUPS, &[(NODE_NAME_EXTRA, node)])
}

/// The Helm chart installs on the API server, and `migdra serve` with only its
/// ClusterRole (the kustomize base's, by tests/library/chart.rs; its service account, impersonated on
/// node-a) publishes, and prepares and unprepares a claim through the real scheduler, writing the
/// claim status. With the same identity, a slice of another node is refused by the chart's
/// admission policy (daemonset/base/admission-policy.yaml's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_with_only_the_daemonset_role() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start_with(true).await;
    check_slices(&cluster).await;

    cluster.create_pod("p-rbac", "1g.10gb", None).await;
    match cluster.outcome("p-rbac", Duration::from_secs(60)).await {
        Outcome::Bound => {}
        Outcome::Unschedulable(m) => panic!("p-rbac unschedulable on empty GPUs: {m}\n{}", cluster.diagnostics()),
    }
    let devices = cluster.prepare("p-rbac").await;
    println!("as {SERVICE_ACCOUNT} on {NODE}: slices published, p-rbac prepared {devices:?} with its status written");
    cluster.finish("p-rbac", true).await;

    let sa = ControlPlane::client_from(&service_account_kubeconfig(&cluster.cp, NODE)).await;
    // Events, as src/kube/events.rs posts a Node's: get, create, then get and replace.
    let events: Api<Event> = Api::namespaced(sa.clone(), "default");
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": "rbac-check.migdra", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": NODE},
        "reason": "RbacCheck", "message": "x", "type": "Warning", "count": 1
    }))
    .unwrap();
    assert!(events.get_opt("rbac-check.migdra").await.unwrap().is_none());
    events.create(&PostParams::default(), &event).await.unwrap();
    let mut event = events.get("rbac-check.migdra").await.unwrap();
    event.count = Some(2);
    events.replace("rbac-check.migdra", &PostParams::default(), &event).await.unwrap();
    assert!(
        !cluster.daemon.log().to_ascii_lowercase().contains("forbidden"),
        "migdra serve was refused something:\n{}",
        cluster.diagnostics()
    );

    // Another node's slice: RBAC allows it, the admission policy refuses it. The policy takes
    // effect once the API server has loaded it, so a slice that gets through early is removed
    // and tried again.
    let other: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "node-b-not-mine"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "node-b",
            "pool": {"name": "node-b", "generation": 1, "resourceSliceCount": 1},
            "devices": []
        }
    }))
    .unwrap();
    let as_sa: Api<ResourceSlice> = Api::all(sa);
    let as_admin: Api<ResourceSlice> = Api::all(cluster.client.clone());
    let (as_sa, as_admin, other) = (&as_sa, &as_admin, &other);
    let refusal = eventually("node-b's slice refused")
        .within(Duration::from_secs(30))
        .every(Duration::from_millis(250))
        .until_async(move || async move {
            match as_sa.create(&PostParams::default(), other).await {
                Err(kube::Error::Api(s)) => Ok(s),
                Err(e) => panic!("creating node-b's slice: {e}"),
                Ok(_) => {
                    as_admin.delete("node-b-not-mine", &DeleteParams::default()).await.unwrap();
                    Err("still accepted".to_string())
                }
            }
        })
        .await;
    assert!(
        (refusal.code == 403 || refusal.code == 422)
            && refusal.message.contains("migdra-resourceslices-own-node")
            && refusal.message.contains("may write only ResourceSlices"),
        "not the policy's refusal: {refusal:?}"
    );
    println!("as {SERVICE_ACCOUNT} on {NODE}, node-b's slice refused: {} {}", refusal.code, refusal.message);
}

/// A device taint: key, value, effect, timeAdded.
type Taint = (String, Option<String>, String, String);

/// Every taint of our published devices, by device.
fn taints(published: &[ResourceSlice]) -> BTreeMap<String, Vec<Taint>> {
    published
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .filter_map(|d| {
            let t = d.taints.as_ref().filter(|t| !t.is_empty())?;
            let t = t
                .iter()
                .map(|t| {
                    let added = t.time_added.as_ref().map(|a| a.0.to_string()).unwrap_or_default();
                    (t.key.clone(), t.value.clone(), t.effect.clone(), added)
                })
                .collect();
            Some((d.name.clone(), t))
        })
        .collect()
}

/// A GPU that had a critical XID gets a NoSchedule taint on every device it has (every
/// partition, and the device of the instance already in use), and the real scheduler puts new
/// claims elsewhere: a claim that fits only there stays pending. The taint keeps its time while
/// the GPU stays unhealthy; once it recovers the taints go and the pending claim lands on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_gpu_is_tainted_and_avoided_until_it_recovers() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start().await;
    let version = &cluster.cp.versions.apiserver;
    if cluster.cp.versions.minor() < 36 {
        // DRADeviceTaints is alpha and off before 1.36: the server drops the taints, which
        // slices_on_a_1_34_api_server_use_the_combined_layout checks (and that nothing loops).
        println!("device taints: not on {version} (DRADeviceTaints is alpha and off before 1.36)");
        return;
    }
    assert_eq!(taints(&cluster.published(Duration::from_secs(30)).await), BTreeMap::new(), "healthy: no taints");

    // An instance in use on one H100: that GPU is the one that fails.
    cluster.create_pod("t-1g", "1g.10gb", None).await;
    assert_eq!(cluster.outcome("t-1g", Duration::from_secs(60)).await, Outcome::Bound);
    let in_use = cluster.prepare("t-1g").await.remove(0);
    let sick = DeviceName::parse(&in_use).unwrap().minor();
    let gpus = cluster.node.layout()["gpus"].as_array().unwrap().clone();
    let uuid_of = |minor: u32| {
        let g = gpus.iter().find(|g| g["minor"] == minor).unwrap();
        g["uuid"].as_str().unwrap().to_string()
    };
    let sick_uuid = uuid_of(sick);
    let on_sick = |name: &str| DeviceName::parse(name).unwrap().minor() == sick;
    cluster.node.cli(&["sim", "health", "--gpu", &sick_uuid, "--unhealthy"]);

    let t0 = Instant::now();
    let tainted = eventually("every device of the unhealthy GPU tainted")
        .within(Duration::from_secs(30))
        .every(Duration::from_millis(100))
        .explain(|| cluster.diagnostics())
        .until_async(|| async {
            let published = cluster.published(Duration::from_secs(30)).await;
            let names: Vec<String> =
                published.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.clone()).collect();
            let t = taints(&published);
            let want: BTreeSet<&String> = names.iter().filter(|n| on_sick(n)).collect();
            let got: BTreeSet<&String> = t.keys().collect();
            if got == want { Ok(t) } else { Err(format!("tainted {got:?}, want {want:?}")) }
        })
        .await;
    println!("{} devices of GPU minor {sick} tainted {:.1?} after the XID", tainted.len(), t0.elapsed());
    assert!(tainted.contains_key(&in_use), "the instance in use is tainted too: {tainted:?}");
    for (device, t) in &tainted {
        assert_eq!(t.len(), 1, "{device}: {t:?}");
        let (key, value, effect, added) = &t[0];
        assert_eq!(
            (key.as_str(), value.as_deref(), effect.as_str()),
            (&*format!("{DRIVER}/xid"), Some("79"), "NoSchedule")
        );
        assert!(!added.is_empty(), "{device}: timeAdded is set");
    }
    lean_reads_agree(&cluster.cp.client().await).await;

    // The other H100 takes two 3g.40gb claims; a third fits only on the tainted GPU (at
    // placement 0, beside the 1g instance at the end) and stays pending.
    for pod in ["t-3g-a", "t-3g-b"] {
        cluster.create_pod(pod, "3g.40gb", None).await;
        assert_eq!(cluster.outcome(pod, Duration::from_secs(60)).await, Outcome::Bound, "{pod}");
        let device = cluster.prepare(pod).await.remove(0);
        assert!(!on_sick(&device), "{pod} got {device} on the tainted GPU");
    }
    cluster.create_pod("t-3g-c", "3g.40gb", None).await;
    match cluster.outcome("t-3g-c", Duration::from_secs(60)).await {
        Outcome::Unschedulable(m) => println!("t-3g-c pending while GPU minor {sick} is tainted: {m}"),
        Outcome::Bound => panic!("t-3g-c bound while only the tainted GPU has room: {:?}", cluster.allocations().await),
    }
    let fit = cluster.fits_now("3g.40gb").await.expect("without the taint 3g.40gb would fit");
    assert!(on_sick(&fit), "{fit}");
    let why = kubectl_migdra_ok(cluster.cp.kubeconfig(), &["why", "t-3g-c", "-n", NS]);
    println!("kubectl migdra why t-3g-c:\n{why}");
    let sick_gpu = cluster.node.minors().iter().position(|m| *m == u64::from(sick)).unwrap();
    let sick_line = format!(
        "{NODE} gpu-{sick} (GPU {sick_gpu}, slurm {sick_gpu}): free but tainted {DRIVER}/xid=79:NoSchedule, \
         not tolerated"
    );
    assert!(why.contains(&sick_line), "{why}");
    // Both 3g.40gb placements of the healthy GPU are held by 3g.40gb claims: taken, not full of
    // others' partitions, and nobody to move.
    assert!(why.contains(": taken: every matching device is held, by team-a/t-3g-a (claim t-3g-a-gpu-"), "{why}");
    let usage = kubectl_migdra_ok(cluster.cp.kubeconfig(), &["usage"]);
    assert!(usage.contains(&format!("  TAINTED {DRIVER}/xid=79:NoSchedule")), "{usage}");
    let later = taints(&cluster.published(Duration::from_secs(30)).await);
    assert_eq!(later, tainted, "the taints, times included, stay as they were while the GPU is unhealthy");
    check_slices_stay_put(&cluster).await;

    cluster.node.cli(&["sim", "health", "--gpu", &sick_uuid]);
    let t0 = Instant::now();
    eventually("the taints removed after recovery")
        .within(Duration::from_secs(30))
        .every(Duration::from_millis(100))
        .explain(|| cluster.diagnostics())
        .until_async(|| async {
            let t = taints(&cluster.published(Duration::from_secs(30)).await);
            if t.is_empty() { Ok(()) } else { Err(format!("{} devices still tainted", t.len())) }
        })
        .await;
    println!("taints removed {:.1?} after recovery", t0.elapsed());
    // The pending pod keeps its Unschedulable condition until the scheduler retries it (the slice
    // update requeues it), so wait for its binding, not for a condition.
    let t0 = Instant::now();
    assert!(
        cluster.outcome_bound_within("t-3g-c", Duration::from_secs(60)).await,
        "t-3g-c bound once the GPU recovered\n{}",
        cluster.diagnostics()
    );
    let device = cluster.prepare("t-3g-c").await.remove(0);
    assert!(on_sick(&device), "t-3g-c lands on the recovered GPU: {device}");
    println!("t-3g-c bound {:.1?} after the taints went, prepared on {device}, on the recovered GPU", t0.elapsed());
}

/// Pods come and go; every "unschedulable" must be true by the counter model and NVML's rules,
/// and the placements are counted next to a best-placement baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_never_refuses_what_fits() {
    churn(&[], 100).await;
}

/// The churn with `--device-order best-fit --publish fitting`: before each pod, the publication
/// catches up with the claims (each profile's partitions in the packing model's best-fit order,
/// those that no longer fit left out), and the scheduler takes the device the model predicts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_fit_churn_publishes_and_places_as_the_model_says() {
    churn(&["--device-order", "best-fit", "--publish", "fitting"], 100).await;
}

/// The best-fit publication the packing model makes beside `allocated`: each MIG profile's
/// partitions in published order, the held ones and those that fit.
fn best_fit_order(gpus: &[Gpu], allocated: &[String]) -> BTreeMap<u32, Vec<String>> {
    use migdra::packing::policy::{Policy, publish};
    let (node, mig) = model_node(gpus, allocated);
    let model = node.model();
    let name = |d: &Dev| {
        let p = model.profile(d.placed.profile_id).unwrap();
        DeviceName::mig(mig[d.gpu], &p.name, p.id, d.placed.start).to_string()
    };
    model
        .profiles
        .iter()
        .map(|p| {
            let devs = publish(&node, Policy::BestFit, p.id).into_iter().flatten();
            let kept: Vec<String> = devs.filter(|d| node.fits(*d) || node.is_allocated(*d)).map(|d| name(&d)).collect();
            (p.id, kept)
        })
        .filter(|(_, kept)| !kept.is_empty())
        .collect()
}

/// Each MIG profile's published partitions, in the order the allocator meets them (slices by name).
fn published_order(published: &[ResourceSlice]) -> BTreeMap<u32, Vec<String>> {
    let mut slices: Vec<&ResourceSlice> = published.iter().collect();
    slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for d in slices.iter().flat_map(|s| s.spec.devices.iter().flatten()) {
        if let Ok(DeviceName::Mig { profile_id, .. }) = DeviceName::parse(&d.name) {
            out.entry(profile_id).or_default().push(d.name.clone());
        }
    }
    out
}

/// `requests` pods of a seeded mix against `serve` with `args` added.
async fn churn(args: &[&str], requests: u64) {
    let _serial = SERIAL.lock().await;
    let requests: u64 = std::env::var("MIGDRA_CHURN_PODS").ok().and_then(|s| s.parse().ok()).unwrap_or(requests);
    let seed: u64 = std::env::var("MIGDRA_CHURN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x6d69_6764_7261);
    let mut cluster = Cluster::start().await;
    let ranked = !args.is_empty();
    if ranked {
        cluster.daemon.terminate(Duration::from_secs(5)).await;
        let with: Vec<&str> = ["--resync", RESYNC_ARG].into_iter().chain(args.iter().copied()).collect();
        (cluster.daemon, cluster.kubelet) = cluster.node.serve().args(with).registered().await;
    }
    let mut published = cluster.published(Duration::from_secs(10)).await;
    let (mut predicted, mut agreed, mut republished) = (0, 0, 0);
    let t0 = Instant::now();
    // Small partitions come more often than large ones, as on a shared cluster.
    let mix =
        ["1g.10gb", "1g.10gb", "1g.10gb", "2g.20gb", "2g.20gb", "3g.40gb", "3g.40gb", "4g.40gb", "7g.80gb", WHOLE];
    let mut rng = Rng::new(seed);
    let mut live: Vec<String> = Vec::new();
    let (mut placed, mut refused, mut late, mut baseline, mut deleted) = (0, 0, 0, 0, 0);
    let mut asked: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    let mut latency = Duration::ZERO;
    for i in 0..requests {
        // Someone leaves: about 4 in 10 steps, and always once 8 pods hold GPUs.
        if !live.is_empty() && (live.len() >= 8 || rng.below(10) < 4) {
            let pod = live.swap_remove(rng.below(live.len()));
            cluster.finish(&pod, true).await;
            deleted += 1;
        }
        let profile = mix[rng.below(mix.len())];
        let name = format!("churn-{i:03}-{}", profile.replace('.', "-"));
        let gpus = cluster.gpus();
        let before: Vec<String> = cluster.allocations().await.into_iter().map(|(_, d)| d).collect();
        let best = best_fit(&gpus, &before, profile);
        baseline += u32::from(best);
        if ranked {
            // The publication catches up with the claims: every allocation and release so far.
            let want = best_fit_order(&gpus, &before);
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                published = cluster.published(Duration::from_secs(10)).await;
                let last = published_order(&published);
                if last == want {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{name}: beside {before:?} published per profile {last:?}, the model's best fit {want:?}\n{}",
                    cluster.diagnostics()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            republished += 1;
        }
        let mut prediction = model_choice(&published, &gpus, &before, profile);
        let t = Instant::now();
        cluster.create_pod(&name, profile, None).await;
        let entry = asked.entry(profile).or_default();
        entry.0 += 1;
        let mut outcome = cluster.outcome(&name, Duration::from_secs(60)).await;
        if let Outcome::Unschedulable(message) = &outcome {
            assert!(message.contains("claim"), "{name}: not a DRA refusal: {message}");
            if let Some(device) = cluster.fits_now(profile).await {
                // The scheduler may have decided on a view older than the last deallocation; it
                // retries on that event. Only a refusal that lasts is a false "unschedulable".
                assert!(
                    cluster.outcome_bound_within(&name, Duration::from_secs(20)).await,
                    "false unschedulable: {profile} fits at {device} by the counters and NVML's rules, \
                     but the scheduler says: {message}\n{}",
                    cluster.diagnostics()
                );
                late += 1;
                outcome = Outcome::Bound;
                // Decided on an older view: the model, fed the view of now, may differ.
                prediction = None;
            }
        }
        match outcome {
            Outcome::Bound => {
                latency += t.elapsed();
                if let Some(want) = &prediction {
                    // The allocator model against the real scheduler, placement for placement.
                    let got: Vec<String> = cluster.pod_claims(&name).await.iter().flat_map(allocated).collect();
                    predicted += 1;
                    assert_eq!(
                        got,
                        std::slice::from_ref(want),
                        "{name}: the packing model predicted {want} from the published order, the \
                         scheduler chose {got:?}"
                    );
                    agreed += 1;
                }
                cluster.prepare(&name).await;
                placed += 1;
                entry.1 += 1;
                live.push(name);
            }
            Outcome::Unschedulable(_) => {
                refused += 1;
                cluster.finish(&name, false).await;
            }
        }
    }
    for pod in std::mem::take(&mut live) {
        cluster.finish(&pod, true).await;
    }
    let left: usize = cluster.gpus().iter().map(|g| g.instances.len()).sum();
    assert_eq!(left, 0, "MIG instances left after every pod ended");
    let per_profile: Vec<String> = asked.iter().map(|(p, (a, b))| format!("{p} {b}/{a}")).collect();
    let large = |(p, _): &(&&str, &(u32, u32))| ["3g.40gb", "4g.40gb", "7g.80gb"].contains(p);
    let (large_asked, large_placed) = asked.iter().filter(large).fold((0, 0), |(a, b), (_, (x, y))| (a + x, b + y));
    println!(
        "churn {args:?} (seed {seed}): {requests} requests, {deleted} departures; the scheduler placed {placed} \
         ({late} after a retry), refused {refused}, each refusal checked: fits nowhere by the counters and \
         NVML's rules; large (3g and up) placed {large_placed} of {large_asked}; best placement (everything \
         live repacked) would have placed {baseline}; per profile placed/requested: {}; mean time to bind \
         {:.0?}; {:.1?} in all; the packing model predicted {agreed} of {predicted} placements exactly{}",
        per_profile.join(", "),
        latency / placed.max(1),
        t0.elapsed(),
        if ranked { format!("; {republished} publications matched the model's best fit") } else { String::new() }
    );
    if ranked {
        assert_eq!(republished, requests as u32, "every pod met a publication that had caught up");
        assert!(agreed * 2 > placed, "the model predicted most placements: {agreed} of {placed}");
    }
    assert!(placed <= baseline, "the scheduler cannot beat the best placement");
    assert!(placed > 0 && refused + placed == requests as u32);
}

impl Cluster {
    /// Whether the pod gets bound within `timeout`.
    async fn outcome_bound_within(&self, name: &str, timeout: Duration) -> bool {
        eventually(format!("pod {name} bound"))
            .within(timeout)
            .every(Duration::from_millis(200))
            .measure_async(move || async move {
                let pod = self.pods().get(name).await.unwrap();
                pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
            })
            .await
            .is_some()
    }
}

/// The checks the churn relies on, without a control plane: first fit sees fragmentation, the
/// best placement repacks around it, and a whole GPU needs a free MIG-off GPU.
#[test]
fn first_fit_and_best_placement_agree_with_the_rules() {
    let h100 = catalog::model("h100-80gb").unwrap();
    let a100 = catalog::model("a100-40gb").unwrap();
    let gpu = |minor, model, mig| Gpu { minor, model, mig, instances: BTreeMap::new() };
    let gpus = [gpu(1, h100, true), gpu(2, a100, false)];
    // 1g at 0 and 4: neither 3g placement (0, 4) is free, but moving the 1gs makes room.
    let live = ["gpu-1-mig-1g10gb-19-0".to_string(), "gpu-1-mig-1g10gb-19-4".to_string()];
    let refs = live.iter().map(String::as_str);
    assert_eq!(first_fit(&gpus, refs.clone(), "3g.40gb"), None);
    assert!(best_fit(&gpus, &live, "3g.40gb"));
    assert_eq!(first_fit(&gpus, refs.clone(), "2g.20gb"), Some("gpu-1-mig-2g20gb-14-2".into()));
    assert!(!best_fit(&gpus, &live, "7g.80gb"));
    // Seven 1gs fill the GPU; an eighth fits nowhere, however they are moved.
    let full: Vec<String> = (0..7).map(|s| format!("gpu-1-mig-1g10gb-19-{s}")).collect();
    assert!(!best_fit(&gpus, &full, "1g.10gb"));
    assert_eq!(first_fit(&gpus, refs, WHOLE), Some("gpu-2".into()));
    assert!(!best_fit(&gpus, &["gpu-2".to_string()], WHOLE));
}

/// An API server with `DRADeviceTaints` off (alpha and off on 1.34 and 1.35; here the 1.36
/// kube-apiserver with the gate turned off) drops the taints of an unhealthy GPU. migdra says so
/// and does not send them again, so nothing loops rewriting the slices. (Until ad9ee16 this ran on
/// a 1.34 server, which also checked the combined layout there; 1.34 is past its end of life
/// and left the matrix, and the combined layout is checked against tests/apiserver/'s server.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_drops_device_taints_is_not_rewritten_in_a_loop() {
    let _serial = SERIAL.lock().await;
    let cp = ControlPlane::start_apiserver_only(release_dir(K136, &["kube-apiserver"]), "DRADeviceTaints=false").await;
    println!(
        "DRADeviceTaints off: kube-apiserver {}, etcd {} (started in {:.1?})",
        cp.versions.apiserver, cp.versions.etcd, cp.startup
    );
    let client = cp.client().await;
    create_node(&client, NODE).await;
    let node = NodeDir::new().simulate(SPEC).kubeconfig(cp.kubeconfig().to_path_buf());
    let daemon = node.serve().default_intervals().args(["--resync", RESYNC_ARG]).spawn();
    let explain = || format!("{}\n{}", daemon.log_tail(), cp.logs());
    let (published, _) = pool(&client, NODE, Duration::from_secs(60), explain).await;
    assert_eq!(slices::validate(&published, Layout::Split), Vec::<String>::new());
    node.cli(&["sim", "health", "--gpu", "0", "--unhealthy"]);
    eventually("migdra notices the dropped taints")
        .within(Duration::from_secs(30))
        .every(Duration::from_millis(200))
        .explain(explain)
        .until(|| daemon.log().contains("dropped the device taints"))
        .await;
    let versions = |slices: &[ResourceSlice]| -> Vec<(Option<String>, Option<String>)> {
        slices.iter().map(|s| (s.metadata.name.clone(), s.metadata.resource_version.clone())).collect()
    };
    let before = versions(&pool(&client, NODE, Duration::from_secs(30), explain).await.0);
    tokio::time::sleep(QUIET).await;
    let after = pool(&client, NODE, Duration::from_secs(30), explain).await.0;
    assert_eq!(before, versions(&after), "migdra keeps rewriting slices whose taints the server drops\n{}", explain());
    assert!(after.iter().flat_map(|s| s.spec.devices.iter().flatten()).all(|d| d.taints.is_none()));
}

/// A server that refuses watches (here the chart's ClusterRole without `watch`, as a trimmed role
/// or a proxy would) gets a list per backoff step from the claim follower and the publisher's
/// drift watch, never a list loop: the API server's own request counter counts the lists of a
/// window once both have settled into their waits. The node still publishes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_watch_lists_again_after_a_backoff_not_in_a_loop() {
    let _serial = SERIAL.lock().await;
    let cp = ControlPlane::start_apiserver_only(support::controlplane::bin_dir(), "").await;
    let client = cp.client().await;
    create_node(&client, NODE).await;
    let rbac = repo().join("daemonset/base/rbac.yaml");
    let mut docs = support::cluster::documents(&rbac);
    for rule in docs.iter_mut().filter(|d| d["kind"] == "ClusterRole").flat_map(|d| d["rules"].as_array_mut().unwrap())
    {
        rule["verbs"].as_array_mut().unwrap().retain(|v| v != "watch");
    }
    support::cluster::create_all(&client, "rbac.yaml without watch", docs, NS).await;
    let node = NodeDir::new().simulate(SPEC).kubeconfig(service_account_kubeconfig(&cp, NODE));
    // best-fit ranks by what claims hold, so the claim follower runs; a long resync, so that no
    // periodic check lists in the window.
    let daemon = node.serve().default_intervals().args(["--resync", "10m", "--device-order", "best-fit"]).spawn();
    let explain = || format!("{}\n{}", daemon.log_tail(), cp.logs());
    let (published, _) = pool(&client, NODE, Duration::from_secs(60), explain).await;
    assert_eq!(slices::validate(&published, Layout::Split), Vec::<String>::new());
    let lists = || async {
        let text = client.request_text(http::Request::get("/metrics").body(Vec::new()).unwrap()).await.unwrap();
        let count = |resource: &str, verb: &str| -> f64 {
            let labels = [format!("resource=\"{resource}\""), format!("verb=\"{verb}\"")];
            text.lines()
                .filter(|l| l.starts_with("apiserver_request_total{") && labels.iter().all(|w| l.contains(w.as_str())))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        (count("resourceclaims", "LIST"), count("resourceslices", "LIST"))
    };
    // Both loops are past their first steps (0.1-0.2 s, doubling) by then.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = lists().await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = lists().await;
    let (claims, slices_listed) = (after.0 - before.0, after.1 - before.1);
    // A refused request never reaches the server's request counter: the daemon's warnings count
    // the watches it tried.
    let tried = daemon.log().matches("watching ResourceClaims failed").count();
    println!(
        "watches refused: {claims} lists of ResourceClaims and {slices_listed} of ResourceSlices in 30 s; \
         {tried} claim watches tried since the start"
    );

    // Waits of at least 3.2 s, then 6.4, 12.8: at most about five steps fit in the window.
    assert!(claims <= 6.0, "{claims} lists of every ResourceClaim in 30 s: a list loop\n{}", explain());
    assert!(slices_listed <= 6.0, "{slices_listed} lists of this node's slices in 30 s: a list loop\n{}", explain());
    assert!(tried >= 2, "the claim follower stopped trying to watch\n{}", explain());
    assert!(daemon.log().contains("watching ResourceSlices failed"), "{}", explain());
}

/// The monitoring example's namespace (labelled for admin access).
const MONITORING_NS: &str = "gpu-monitoring";

/// The CDI spec migdra wrote for a claim: every device node path, and the environment.
fn cdi_spec(node: &NodeDir, uid: &str) -> Option<(Vec<String>, Vec<String>)> {
    let path = node.cdi_dir().join(format!("{DRIVER}-claim_{uid}.json"));
    let spec: Value = serde_json::from_slice(&std::fs::read(path).ok()?).unwrap();
    let edits = &spec["devices"][0]["containerEdits"];
    let strings = |v: &Value, key: Option<&str>| -> Vec<String> {
        v.as_array().into_iter().flatten().map(|e| key.map_or(e, |k| &e[k]).as_str().unwrap().to_string()).collect()
    };
    Some((strings(&edits["deviceNodes"], Some("path")), strings(&edits["env"], None)))
}

/// Admin access on the real control plane: a MIG claim on GPU index 0 is prepared (its instance
/// made); then the monitoring example's claim (daemonset/examples/monitoring, `adminAccess: true`
/// in a labelled namespace) is allocated by the real scheduler on the same GPU and prepared with
/// no instance created or destroyed, its spec listing the GPU and the existing instance; its
/// unprepare removes only its spec. Admin access to the partition the workload holds stays
/// unschedulable (the scheduler checks its counters, kubernetes#140729). A claim asking for admin
/// access in an unlabelled namespace is refused by the API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_access_watches_a_gpu_without_touching_its_instances() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start().await;
    let example = repo().join("daemonset/examples/monitoring/monitoring.yaml");
    // No DaemonSet controller runs here: the test plays its pod.
    let docs: Vec<Value> =
        support::cluster::documents(&example).into_iter().filter(|d| d["kind"] != "DaemonSet").collect();
    support::cluster::create_all(&cluster.client, &example.display().to_string(), docs, MONITORING_NS).await;

    // A workload: 3g.40gb on GPU index 0, prepared (the instance is made).
    let worker: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "worker-3g", "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "mig", "exactly": {
            "deviceClassName": "mig-3g.40gb",
            "selectors": [{"cel": {"expression": format!("device.attributes[\"{DRIVER}\"].index == 0")}}]
        }}]}}
    }))
    .unwrap();
    cluster.claims().create(&PostParams::default(), &worker).await.unwrap();
    cluster.create_pod("p-worker", "3g.40gb", Some("worker-3g")).await;
    assert_eq!(cluster.outcome("p-worker", Duration::from_secs(60)).await, Outcome::Bound);
    let worker_device = cluster.prepare("p-worker").await.remove(0);
    let gpu_minor = DeviceName::parse(&worker_device).unwrap().minor();
    let worker_uid = cluster.claims().get("worker-3g").await.unwrap().metadata.uid.unwrap();

    // The monitoring pod, from the example's template.
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), MONITORING_NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "dcgm", "namespace": MONITORING_NS},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": false,
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "gpu-monitor"}],
            "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpus"}]}
            }]
        }
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    match outcome(&pods, "dcgm", Duration::from_secs(60), || cluster.diagnostics()).await {
        Outcome::Bound => {}
        Outcome::Unschedulable(m) => panic!("the monitoring pod is unschedulable: {m}\n{}", cluster.diagnostics()),
    }
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), MONITORING_NS);
    let monitor = claims.list(&ListParams::default()).await.unwrap().items.remove(0);
    let results = monitor.status.as_ref().unwrap().allocation.as_ref().unwrap().devices.as_ref().unwrap();
    let result = &results.results.as_ref().unwrap()[0];
    assert_eq!(result.admin_access, Some(true), "{result:?}");
    let watched = DeviceName::parse(&result.device).unwrap();
    assert_eq!(watched.minor(), gpu_minor, "the same GPU: {} and {worker_device}", result.device);

    let before = cluster.gpus();
    let r = claim_ref(&monitor);
    let out = cluster.kubelet.prepare(Version::V1, std::slice::from_ref(&r)).await.unwrap();
    let devices = out[&r.uid].as_ref().unwrap_or_else(|e| panic!("admin prepare: {e}\n{}", cluster.diagnostics()));
    assert_eq!(devices[0].device, result.device);
    let after = cluster.gpus();
    let instances = |gpus: &[Gpu]| gpus.iter().map(|g| g.instances.clone()).collect::<Vec<_>>();
    assert_eq!(instances(&after), instances(&before), "no instance created or destroyed");
    let (nodes, env) = cdi_spec(&cluster.node, &r.uid).expect("the admin claim's spec");
    let (worker_nodes, _) = cdi_spec(&cluster.node, &worker_uid).expect("the worker's spec");
    let caps = |n: &[String]| n.iter().filter(|p| p.starts_with("/dev/nvidia-caps/")).cloned().collect::<Vec<_>>();
    assert!(nodes.contains(&format!("/dev/nvidia{gpu_minor}")), "{nodes:?}");
    assert_eq!(caps(&nodes), caps(&worker_nodes), "the existing instance's GI and CI nodes");
    assert!(env.contains(&"MIGDRA_ADMIN_ACCESS=true".to_string()), "{env:?}");

    // Its status: the GPU, no MIG UUID of its own, nothing for the bridge to reserve.
    let data = eventually("the admin claim's status")
        .every(Duration::from_millis(100))
        .explain(|| cluster.diagnostics())
        .until_async(|| async {
            let c = claims.get(monitor.metadata.name.as_ref().unwrap()).await.unwrap();
            ours(&c).first().map(|d| d["data"].clone()).ok_or_else(|| format!("{:?}", c.status))
        })
        .await;
    assert_eq!((data["adminAccess"].as_bool(), data["slurmShards"].as_u64()), (Some(true), Some(0)), "{data}");
    assert!(data.get("migUUID").is_none() && data["parentUUID"].as_str().is_some_and(|u| u.starts_with("GPU-")));
    println!("admin claim {} on {}: spec nodes {nodes:?}; status {data}", r.name, result.device);

    // The worker's own partition for admin access: the scheduler checks its counters like an
    // ordinary device's (kubernetes#140729), so it stays pending while the worker holds them.
    let DeviceName::Mig { start: worker_start, .. } = DeviceName::parse(&worker_device).unwrap() else {
        panic!("{worker_device} is a MIG partition")
    };
    let busy: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "monitor-busy", "namespace": MONITORING_NS},
        "spec": {"devices": {"requests": [{"name": "gpu0", "exactly": {"deviceClassName": "mig", "adminAccess": true,
            "selectors": [{"cel": {"expression": format!(
                "device.attributes[\"{DRIVER}\"].index == 0 && \
                 device.attributes[\"{DRIVER}\"].placementStart == {worker_start} && \
                 device.attributes[\"{DRIVER}\"].profile == \"3g.40gb\""
            )}}]}}]}}
    }))
    .unwrap();
    claims.create(&PostParams::default(), &busy).await.unwrap();
    let mut busy_pod = pod.clone();
    busy_pod.metadata.name = Some("dcgm-busy".into());
    busy_pod.spec.as_mut().unwrap().resource_claims.as_mut().unwrap()[0] =
        serde_json::from_value(json!({"name": "gpus", "resourceClaimName": "monitor-busy"})).unwrap();
    pods.create(&PostParams::default(), &busy_pod).await.unwrap();
    match outcome(&pods, "dcgm-busy", Duration::from_secs(60), || cluster.diagnostics()).await {
        Outcome::Unschedulable(m) => {
            println!("admin access to the worker's own partition {worker_device}: unschedulable ({m})")
        }
        Outcome::Bound => panic!(
            "admin access to the worker's own partition {worker_device} was allocated: \
             kubernetes#140729 is fixed in {}; update docs/operating.md and the facts",
            cluster.cp.versions
        ),
    }
    pods.delete("dcgm-busy", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();

    let out = cluster.kubelet.unprepare(Version::V1, std::slice::from_ref(&r)).await.unwrap();
    assert_eq!(out[&r.uid], "");
    assert!(cdi_spec(&cluster.node, &r.uid).is_none(), "its spec is gone");
    assert!(cdi_spec(&cluster.node, &worker_uid).is_some(), "the worker's spec stays");
    assert_eq!(instances(&cluster.gpus()), instances(&before), "the worker's instance stays");
    pods.delete("dcgm", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    cluster.finish("p-worker", true).await;

    // Without the label, the API server refuses admin access (the namespace of the workloads).
    let mut refused: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "sneaky-monitor", "namespace": NS},
        "spec": {"devices": {"requests": [
            {"name": "gpu0", "exactly": {"deviceClassName": "mig", "adminAccess": true}}
        ]}}
    }))
    .unwrap();
    let err = cluster.claims().create(&PostParams::default(), &refused).await.unwrap_err().to_string();
    assert!(err.contains("resource.kubernetes.io/admin-access"), "{err}");
    refused.metadata.name = Some("monitor-allowed".into());
    refused.metadata.namespace = Some(MONITORING_NS.into());
    claims.create(&PostParams::default(), &refused).await.expect("the labelled namespace admits it");
    println!("unlabelled namespace {NS}: {err}");
}

/// A prepare killed part-way leaves its claim `PrepareStarted` with an instance. The pod of one
/// such claim is deleted before the kubelet retries: once the API server deallocates or deletes
/// its claim, the restarted daemon's periodic check rolls it back, instance and all. The other
/// claim, still allocated here, is never touched and the kubelet's retry adopts its instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_left_mid_prepare_whose_pod_is_deleted_is_rolled_back() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start().await;
    cluster.daemon.terminate(Duration::from_secs(5)).await;
    let mut crashed = Vec::new();
    for (pod, profile) in [("p-gone", "1g.10gb"), ("p-kept", "2g.20gb")] {
        cluster.create_pod(pod, profile, None).await;
        assert!(cluster.outcome_bound_within(pod, Duration::from_secs(60)).await, "{pod} not bound");
        let (mut doomed, kubelet) =
            cluster.node.serve().args(["--resync", RESYNC_ARG]).env("MIGDRA_CRASH_AT", "ci-created").registered().await;
        let refs: Vec<ClaimRef> = cluster.pod_claims(pod).await.iter().map(claim_ref).collect();
        assert!(kubelet.prepare(Version::V1, &refs).await.is_err(), "{pod}: a daemon killed mid-prepare answered");
        let status = doomed.wait_exit(Duration::from_secs(10)).await.expect("the daemon killed at ci-created");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "{status:?}");
        crashed.push(refs[0].clone());
    }
    let states = |cluster: &Cluster| -> BTreeMap<String, String> {
        cluster
            .node
            .checkpoint()
            .iter()
            .map(|c| (c["uid"].as_str().unwrap().to_string(), c["state"].as_str().unwrap().to_string()))
            .collect()
    };
    let (gone, kept) = (&crashed[0], &crashed[1]);
    assert_eq!(states(&cluster).values().collect::<Vec<_>>(), ["PrepareStarted", "PrepareStarted"]);
    let instances = |cluster: &Cluster| cluster.gpus().iter().map(|g| g.instances.len()).sum::<usize>();
    assert_eq!(instances(&cluster), 2, "each killed prepare left its instance");

    // The pod goes while migdra is down; its template's claim goes with it.
    cluster
        .pods()
        .delete("p-gone", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
        .await
        .unwrap();
    eventually(format!("claim {} deleted or deallocated", gone.name))
        .within(Duration::from_secs(60))
        .until_async(|| async {
            match cluster.claims().get_opt(&gone.name).await.unwrap() {
                Some(c) if !allocated(&c).is_empty() => Err(format!("{:?}", c.status)),
                _ => Ok(()),
            }
        })
        .await;

    let (daemon, kubelet) = cluster.node.serve().args(["--resync", RESYNC_ARG]).registered().await;
    cluster.daemon = daemon;
    cluster.kubelet = kubelet;
    eventually(format!("claim {} rolled back", gone.name))
        .within(Duration::from_secs(30))
        .explain(|| cluster.diagnostics())
        .until(|| {
            let s = states(&cluster);
            if !s.contains_key(&gone.uid) { Ok(()) } else { Err(format!("{s:?}")) }
        })
        .await;
    // The daemon logs once its whole check is done (the other claim's lookup comes after).
    eventually("the rollback in the daemon's log")
        .within(Duration::from_secs(10))
        .explain(|| cluster.daemon.log_tail())
        .until(|| cluster.daemon.log().contains("rolled back, its instances released"))
        .await;
    assert_eq!(instances(&cluster), 1, "the deleted pod's instance released, the other kept");
    // Three more checks (1 s apart) leave the claim the API still allocates here alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(states(&cluster).get(&kept.uid).map(String::as_str), Some("PrepareStarted"));
    assert_eq!(instances(&cluster), 1);
    let devices = cluster.prepare("p-kept").await;
    assert_eq!(instances(&cluster), 1, "the kubelet's retry adopted the instance: {devices:?}");
    cluster.finish("p-kept", true).await;
    assert_eq!(instances(&cluster), 0);
    assert!(cluster.node.checkpoint().is_empty());
}

/// The API server is not there when migdra starts: `serve` starts anyway, serves the kubelet,
/// stays not ready for the probe (which names the address and the failure), retries with
/// backoff, and publishes as soon as the API server answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_waits_for_an_api_server_that_is_not_there_yet() {
    let _serial = SERIAL.lock().await;
    let mut cp = ControlPlane::start().await;
    let client = cp.client().await;
    create_node(&client, NODE).await;
    apply(&client, &repo().join("daemonset/base/deviceclasses.yaml"), NS).await;
    cp.stop("kube-apiserver");
    let node = NodeDir::new().simulate(SPEC).kubeconfig(cp.kubeconfig().to_path_buf());
    let (mut daemon, _kubelet) = node.serve().args(["--resync", RESYNC_ARG]).registered().await;
    let ready = || node.probe(None).arg("--ready").arg("--timeout").arg("1s").output().unwrap();
    let why = eventually("probe --ready failing with the API server's address")
        .within(Duration::from_secs(20))
        .explain(|| daemon.log_tail())
        .until(|| {
            let out = ready();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            if !out.status.success() && err.contains("not publishing ResourceSlices") { Ok(err) } else { Err(err) }
        })
        .await;
    println!("API server down at start: {}", why.trim());
    assert!(why.contains(&cp.url) && why.contains("Connection refused"), "{why}");
    assert_eq!(why.trim().lines().count(), 1, "{why}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(daemon.running(), "serve gave up on an API server that is not there yet: {}", daemon.log_tail());
    let retries = daemon.log().matches("publishing ResourceSlices failed").count();
    assert!((2..40).contains(&retries), "retried {retries} times in ~4 s: backoff, not a tight loop");

    let t = Instant::now();
    cp.restart("kube-apiserver");
    eventually("the API server answering again")
        .within(Duration::from_secs(60))
        .every(Duration::from_millis(200))
        .until_async(|| async { client.apiserver_version().await.map(|_| ()).map_err(|e| e.to_string()) })
        .await;
    pool(&client, NODE, Duration::from_secs(60), || daemon.log_tail()).await;
    eventually("probe --ready passing once published")
        .within(Duration::from_secs(30))
        .explain(|| daemon.log_tail())
        .until(|| ready().status.success())
        .await;
    println!("published and ready {:.1?} after the API server started, {retries} failed rounds before", t.elapsed());
}

/// `serve` killed right after it wrote one ResourceSlice of several, and right after it wrote a
/// claim's status: started again, the pool is complete and valid with the same devices, and the
/// claim's status holds our one entry, with the same device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_killed_after_an_api_write_converges_when_started_again() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start().await;
    let names = |slices: &[ResourceSlice]| -> BTreeSet<String> {
        slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.clone()).collect()
    };
    let before = cluster.published(Duration::from_secs(60)).await;
    assert!(before.len() > 1, "several slices, so a kill can fall between two writes");
    cluster.daemon.terminate(Duration::from_secs(5)).await;
    let api: Api<ResourceSlice> = Api::all(cluster.client.clone());
    let of_node = ListParams::default().labels(&format!("{DRIVER}/node={NODE}"));
    api.delete_collection(&DeleteParams::default(), &of_node).await.unwrap();

    let mut doomed =
        cluster.node.serve().args(["--resync", RESYNC_ARG]).env("MIGDRA_CRASH_AT", "slice-written").spawn();
    let status = doomed.wait_exit(Duration::from_secs(30)).await.expect("killed after its first slice write");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "{status:?}");
    let partial = api.list(&of_node).await.unwrap().items.len();
    assert!(partial >= 1 && partial < before.len(), "{partial} of {} slices written before the kill", before.len());
    let (daemon, kubelet) = cluster.node.serve().args(["--resync", RESYNC_ARG]).registered().await;
    (cluster.daemon, cluster.kubelet) = (daemon, kubelet);
    check_slices(&cluster).await;
    assert_eq!(names(&cluster.published(Duration::from_secs(30)).await), names(&before));

    cluster.create_pod("p-status", "1g.10gb", None).await;
    assert!(cluster.outcome_bound_within("p-status", Duration::from_secs(60)).await);
    cluster.daemon.terminate(Duration::from_secs(5)).await;
    let (mut doomed, kubelet) =
        cluster.node.serve().args(["--resync", RESYNC_ARG]).env("MIGDRA_CRASH_AT", "status-written").registered().await;
    let refs: Vec<ClaimRef> = cluster.pod_claims("p-status").await.iter().map(claim_ref).collect();
    let answered = kubelet.prepare(Version::V1, &refs).await;
    let status = doomed.wait_exit(Duration::from_secs(10)).await.expect("killed after the status write");
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9), "{status:?} ({answered:?})");
    let (daemon, kubelet) = cluster.node.serve().args(["--resync", RESYNC_ARG]).registered().await;
    (cluster.daemon, cluster.kubelet) = (daemon, kubelet);
    let devices = cluster.prepare("p-status").await;
    let claim = cluster.claims().get(&refs[0].name).await.unwrap();
    assert_eq!(ours(&claim).len(), 1, "one status entry of ours: {:?}", claim.status);
    assert_eq!(ours(&claim)[0]["device"], devices[0].as_str());
    cluster.finish("p-status", true).await;
    assert!(cluster.node.checkpoint().is_empty());
}

/// A device a claim holds stays published whatever `--profiles` says: the scheduler allocates a
/// 3g.40gb device, migdra restarts with `--profiles 1g.10gb` before the kubelet prepares it (so no
/// instance keeps it published), and the device stays, in every publication, until the claim
/// lets go; then the allowlist applies. Without the claims followed, the restart drops it and the
/// scheduler stops counting what it consumes (kubernetes#140802).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_device_stays_published_whatever_the_allowlist() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start().await;
    let names = |slices: &[ResourceSlice]| -> BTreeSet<String> {
        slices.iter().flat_map(|s| s.spec.devices.iter().flatten()).map(|d| d.name.clone()).collect()
    };
    cluster.create_pod("held", "3g.40gb", None).await;
    assert!(cluster.outcome_bound_within("held", Duration::from_secs(60)).await, "{}", cluster.diagnostics());
    let device = allocated(&cluster.pod_claims("held").await[0])[0].clone();
    assert!(device.contains("-mig-3g40gb-"), "{device}");
    let gpu = format!("gpu-{}-mig-", DeviceName::parse(&device).unwrap().minor());
    cluster.daemon.terminate(Duration::from_secs(5)).await;

    // Every version of our slices from here on, as a watch sees them.
    let api: Api<ResourceSlice> = Api::all(cluster.client.clone());
    let of_node = format!("{DRIVER}/node={NODE}");
    let from = api.list(&ListParams::default().labels(&of_node)).await.unwrap().metadata.resource_version.unwrap();
    let seen = Arc::new(StdMutex::new(Vec::new()));
    let watcher = tokio::spawn(record(
        api,
        WatchParams::default().labels(&of_node),
        from,
        seen.clone(),
        move |s: &ResourceSlice, deleted| {
            let devices = names(std::slice::from_ref(s)).into_iter().map(|n| (n, String::new())).collect();
            Seen::Slice(s.metadata.name.clone().unwrap(), (!deleted).then_some(devices))
        },
    ));
    let (daemon, kubelet) =
        cluster.node.serve().args(["--resync", RESYNC_ARG, "--profiles", "1g.10gb"]).registered().await;
    (cluster.daemon, cluster.kubelet) = (daemon, kubelet);
    let allowlisted = |names: &BTreeSet<String>| !names.iter().any(|n| n.contains("-mig-2g20gb-"));
    let published = eventually("the allowlist published")
        .within(Duration::from_secs(60))
        .until_async(|| async {
            let published = cluster.published(Duration::from_secs(30)).await;
            allowlisted(&names(&published)).then_some(published)
        })
        .await;
    watcher.abort();
    assert_eq!(slices::validate(&published, cluster.layout), Vec::<String>::new());
    let now = names(&published);
    assert!(now.contains(&device), "the held {device} is published: {now:?}");
    let versions = std::mem::take(&mut *seen.lock().unwrap());
    assert!(!versions.is_empty(), "the restart wrote slices");
    for (rv, version) in &versions {
        let Seen::Slice(name, Some(here)) = version else { continue };
        assert!(
            !here.keys().any(|n| n.starts_with(&gpu)) || here.contains_key(&device),
            "at {rv}: slice {name} has {gpu}'s devices but not the held {device}: {here:?}"
        );
    }

    // Released: gone at the next full check.
    cluster.finish("held", false).await;
    eventually(format!("{device} unpublished once released"))
        .within(Duration::from_secs(30))
        .until_async(|| async { !names(&cluster.published(Duration::from_secs(30)).await).contains(&device) })
        .await;
}

/// One recorded change, for replaying both watches in the order the API server wrote them.
enum Seen {
    /// A slice version: its name and its devices (name → JSON); `None` when deleted.
    Slice(String, Option<BTreeMap<String, String>>),
    /// A claim: its UID and the devices of our pool it holds (none: released or deleted).
    Claim(String, Vec<String>),
}

/// Every change of `api`'s objects from `version` on, as (resourceVersion, what) into `into`.
async fn record<K, F>(api: Api<K>, params: WatchParams, version: String, into: Arc<StdMutex<Vec<(u64, Seen)>>>, what: F)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(&K, bool) -> Seen,
{
    let mut stream = api.watch(&params, &version).await.unwrap().boxed();
    while let Some(event) = stream.next().await {
        let (k, deleted) = match event {
            Ok(WatchEvent::Added(k) | WatchEvent::Modified(k)) => (k, false),
            Ok(WatchEvent::Deleted(k)) => (k, true),
            Ok(WatchEvent::Bookmark(_)) => continue,
            other => panic!("watch broke: {other:?}"),
        };
        let rv: u64 = k.meta().resource_version.as_deref().unwrap().parse().unwrap();
        into.lock().unwrap().push((rv, what(&k, deleted)));
    }
}

/// `--publish fitting --device-order best-fit` raced against the real scheduler's allocations and
/// the claim controller's releases: waves of pods of every profile created and deleted while migdra
/// leaves out, brings back and re-ranks partitions after each change. Replayed in the API server's
/// write order, every version of our slices holds every device then allocated, byte for byte as the
/// full publication has it (counter sets too), and no two claims ever hold overlapping partitions;
/// devices did leave, and came back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_only_what_fits_never_drops_an_allocated_device() {
    let _serial = SERIAL.lock().await;
    let mut cluster = Cluster::start().await;
    let devices_of = |s: &ResourceSlice| -> BTreeMap<String, String> {
        s.spec.devices.iter().flatten().map(|d| (d.name.clone(), serde_json::to_string(d).unwrap())).collect()
    };
    let full = cluster.published(Duration::from_secs(30)).await;
    let reference: BTreeMap<String, String> = full.iter().flat_map(devices_of).collect();
    let sets = |s: &[ResourceSlice]| -> Vec<String> {
        s.iter().filter_map(|s| s.spec.shared_counters.as_ref()).map(|c| serde_json::to_string(c).unwrap()).collect()
    };
    let full_sets = sets(&full);
    // Which slice carries each GPU's partitions (`gpu-<minor>-mig-`).
    let slice_of: BTreeMap<String, String> = full
        .iter()
        .flat_map(|s| {
            devices_of(s).into_keys().filter_map(move |d| {
                let i = d.find("-mig-")?;
                Some((d[..i + 5].to_string(), s.metadata.name.clone().unwrap()))
            })
        })
        .collect();
    cluster.daemon.terminate(Duration::from_secs(5)).await;

    let seen = Arc::new(StdMutex::new(Vec::new()));
    let slices_api: Api<ResourceSlice> = Api::all(cluster.client.clone());
    let of_node = format!("{DRIVER}/node={NODE}");
    let listed = slices_api.list(&ListParams::default().labels(&of_node)).await.unwrap();
    let mut state: BTreeMap<String, BTreeMap<String, String>> =
        listed.items.iter().map(|s| (s.metadata.name.clone().unwrap(), devices_of(s))).collect();
    let claims_api: Api<ResourceClaim> = Api::all(cluster.client.clone());
    let claims_listed = claims_api.list(&ListParams::default()).await.unwrap();
    assert!(claims_listed.items.is_empty());
    let watchers = [
        tokio::spawn(record(
            slices_api.clone(),
            WatchParams::default().labels(&of_node),
            listed.metadata.resource_version.unwrap(),
            seen.clone(),
            move |s: &ResourceSlice, deleted| {
                Seen::Slice(s.metadata.name.clone().unwrap(), (!deleted).then(|| devices_of(s)))
            },
        )),
        tokio::spawn(record(
            claims_api,
            WatchParams::default(),
            claims_listed.metadata.resource_version.unwrap(),
            seen.clone(),
            |c: &ResourceClaim, deleted| {
                let held = if deleted { Vec::new() } else { migdra::kube::allocations::held_devices(c, DRIVER, NODE) };
                Seen::Claim(c.metadata.uid.clone().unwrap(), held)
            },
        )),
    ];
    let (daemon, kubelet) = cluster
        .node
        .serve()
        .args(["--resync", RESYNC_ARG, "--publish", "fitting", "--device-order", "best-fit"])
        .registered()
        .await;
    (cluster.daemon, cluster.kubelet) = (daemon, kubelet);

    // Waves: create pods of every profile at once, then delete some of the oldest.
    let profiles = ["1g.10gb", "2g.20gb", "1g.10gb", "3g.40gb", "1g.10gb", "7g.80gb"];
    let mut live: Vec<String> = Vec::new();
    let zero = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    for wave in 0..8 {
        for (i, p) in profiles.iter().enumerate() {
            let name = format!("race-{wave}-{i}");
            cluster.create_pod(&name, p, None).await;
            live.push(name);
        }
        tokio::time::sleep(Duration::from_millis(300 + 100 * (wave % 3))).await;
        for name in live.drain(..live.len().min(4)) {
            cluster.pods().delete(&name, &zero).await.unwrap();
        }
    }
    // Quiet: the last allocations and releases published.
    tokio::time::sleep(Duration::from_secs(5)).await;
    watchers.iter().for_each(tokio::task::JoinHandle::abort);

    let mut events = std::mem::take(&mut *seen.lock().unwrap());
    events.sort_by_key(|(rv, _)| *rv);
    let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let (mut allocations, mut versions, mut fewest) = (0, 0, usize::MAX);
    let gpus = cluster.gpus();
    for (rv, event) in &events {
        match event {
            Seen::Claim(uid, devices) => {
                if !devices.is_empty() && held.get(uid) != Some(devices) {
                    allocations += 1;
                }
                if devices.is_empty() {
                    held.remove(uid);
                } else {
                    held.insert(uid.clone(), devices.clone());
                }
                let all: Vec<&str> = held.values().flatten().map(String::as_str).collect();
                for g in gpus.iter().filter(|g| g.mig) {
                    let placed = placed_on(g.minor, all.iter().copied());
                    assert!(
                        rules::admits_set(g.model, &placed).is_ok(),
                        "at {rv}: overlapping claims on GPU {}: {placed:?}",
                        g.minor
                    );
                }
            }
            Seen::Slice(name, devices) => {
                versions += 1;
                match devices {
                    Some(d) => state.insert(name.clone(), d.clone()),
                    None => state.remove(name),
                };
                let now = state.get(name);
                for device in held.values().flatten() {
                    let Some(i) = device.find("-mig-") else { continue };
                    if slice_of.get(&device[..i + 5]) != Some(name) {
                        continue;
                    }
                    let published = now.and_then(|d| d.get(device));
                    assert_eq!(
                        published,
                        reference.get(device),
                        "at {rv}: slice {name} without the held {device}, or changed"
                    );
                }
                fewest = fewest.min(state.values().map(BTreeMap::len).sum());
            }
        }
    }
    println!(
        "{allocations} allocations, {versions} slice versions, fewest devices published {fewest} of {}",
        reference.len()
    );
    assert!(allocations >= 20, "the scheduler allocated: {allocations}");
    assert!(fewest < reference.len(), "devices were left out at some point");
    let end = cluster.published(Duration::from_secs(30)).await;
    assert_eq!(sets(&end), full_sets, "counter sets unchanged");
    for name in live {
        cluster.pods().delete(&name, &zero).await.unwrap();
    }
    eventually("every device published again once every claim is released")
        .within(Duration::from_secs(60))
        .until_async(|| async {
            let now: BTreeMap<String, String> =
                cluster.published(Duration::from_secs(30)).await.iter().flat_map(devices_of).collect();
            now == reference
        })
        .await;
}

/// `kubectl-migdra ARGS`: this build's binary under its kubectl plugin name, against the control
/// plane, as a user runs it (their kubeconfig, nothing else).
fn kubectl_migdra(kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Output {
    // Beside the kubeconfig: in the control plane's directory, removed with it.
    let dir = kubeconfig.parent().unwrap().join("kubectl-plugins");
    let mut cmd = support::command::scrubbed(support::command::kubectl_plugin(&dir));
    cmd.args(args).env("KUBECONFIG", kubeconfig);
    cmd.run()
}

/// Its stdout, which must come with exit 0.
fn kubectl_migdra_ok(kubeconfig: &std::path::Path, args: &[&str]) -> String {
    let out = kubectl_migdra(kubeconfig, args);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl-migdra {args:?}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A claim by name: one request of `class`, with these CEL selectors.
async fn create_claim(claims: &Api<ResourceClaim>, name: &str, class: &str, selectors: &[String]) {
    let selectors: Vec<Value> = selectors.iter().map(|e| json!({"cel": {"expression": e}})).collect();
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": class, "selectors": selectors}}
        ]}}
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
}

/// `kubectl migdra why` on pods the real scheduler left pending, one per reason: a GPU full
/// (naming the claims on it), fragmented (naming the claim to move), a Slurm pin on a full GPU
/// (and where it would fit without it), a profile no node publishes, and selectors matching
/// nothing; `usage` draws exactly the allocated claims; bad input gets one line each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_migdra_explains_pending_pods_and_draws_usage() {
    let _serial = SERIAL.lock().await;
    let cluster = Cluster::start().await;
    let kc = cluster.cp.kubeconfig().to_path_buf();
    let attr = |name: &str| format!("device.attributes[\"{DRIVER}\"].{name}");
    let gpu_of_slurm = |k: i64| -> u32 {
        let device = cluster.slurm_index.iter().find(|(d, i)| **i == k && d.contains("-mig-")).unwrap().0;
        DeviceName::parse(device).unwrap().minor()
    };
    let (gpu0, gpu1) = (gpu_of_slurm(0), gpu_of_slurm(1));

    // Slurm GPU 1 whole in one 7g.80gb; on Slurm GPU 0, 1g.10gb instances on slices 1 and 5.
    let held = [
        ("big", "mig-7g.80gb", vec![format!("{} == 1", attr("slurmGpuIndex"))]),
        ("small-1", "mig-1g.10gb", vec![format!("{} == 0 && {} == 1", attr("slurmGpuIndex"), attr("placementStart"))]),
        ("small-5", "mig-1g.10gb", vec![format!("{} == 0 && {} == 5", attr("slurmGpuIndex"), attr("placementStart"))]),
    ];
    for (name, class, selectors) in &held {
        create_claim(&cluster.claims(), name, class, selectors).await;
        cluster.create_pod(name, "", Some(name)).await;
        assert_eq!(cluster.outcome(name, Duration::from_secs(60)).await, Outcome::Bound, "{name}");
    }
    let allocations = cluster.allocations().await;
    let device_of = |claim: &str| allocations.iter().find(|(c, _)| c == claim).map(|(_, d)| d.clone()).unwrap();
    assert_eq!(device_of("big"), format!("gpu-{gpu1}-mig-7g80gb-0-0"));
    assert_eq!(device_of("small-1"), format!("gpu-{gpu0}-mig-1g10gb-19-1"));
    assert_eq!(device_of("small-5"), format!("gpu-{gpu0}-mig-1g10gb-19-5"));

    // One pending pod per reason.
    cluster.create_pod("frag", "3g.40gb", None).await;
    create_claim(&cluster.claims(), "pinned", "mig-2g.20gb", &[format!("{} == 1", attr("slurmGpuIndex"))]).await;
    cluster.create_pod("pinned", "", Some("pinned")).await;
    create_claim(&cluster.claims(), "unpublished", "mig", &[format!("{} == \"3g.71gb\"", attr("profile"))]).await;
    cluster.create_pod("unpublished", "", Some("unpublished")).await;
    create_claim(
        &cluster.claims(),
        "nomatch",
        "mig-1g.10gb",
        &[format!("{} == \"NVIDIA A100-SXM4-40GB\"", attr("productName"))],
    )
    .await;
    cluster.create_pod("nomatch", "", Some("nomatch")).await;
    // Written for NVIDIA's device plugin: the scheduler makes its claim only once it fits.
    cluster.create_device_plugin_pod("plugin-style", "nvidia.com/mig-3g.40gb").await;
    for pod in ["frag", "pinned", "unpublished", "nomatch", "plugin-style"] {
        match cluster.outcome(pod, Duration::from_secs(60)).await {
            Outcome::Unschedulable(_) => {}
            Outcome::Bound => panic!("{pod} was bound: {:?}", cluster.allocations().await),
        }
    }
    let why = |pod: &str| kubectl_migdra_ok(&kc, &["why", pod, "-n", NS]);
    let mut fails_plugin_style = false;
    let g = |minor: u32, slurm: i64| {
        format!(
            "{NODE} gpu-{minor} (GPU {}, slurm {slurm})",
            cluster.node.minors().iter().position(|m| *m == u64::from(minor)).unwrap()
        )
    };
    let text = why("frag");
    println!("kubectl migdra why frag:\n{text}");
    assert!(text.contains("scheduler: 0/1 nodes are available"), "{text}");
    assert!(
        text.contains(&format!(
            "{}: fragmented: memory slices 0,2,3,4,6,7 are free, 4 needed in one placement; moving {NS}/small-",
            g(gpu0, 0)
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{}: full: 0 of 8 memory slices free, {} needed; held by {NS}/big (claim big)",
            g(gpu1, 1),
            4
        )),
        "{text}"
    );
    let text = why("pod/pinned");
    println!("kubectl migdra why pod/pinned:\n{text}");
    assert!(
        text.contains(&format!(
            "{}: full: 0 of 8 memory slices free, {} needed; held by {NS}/big (claim big)",
            g(gpu1, 1),
            2
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "pinned to Slurm GPU 1 (slurmGpuIndex); without the pin it would fit on {}",
            g(gpu0, 0)
        )),
        "{text}"
    );
    if cluster.cp.versions.minor() >= 36 {
        let text = why("plugin-style");
        assert!(
            text.contains("claim team-a/(extended resources)\n  request main-mig-3g.40gb: class mig-3g.40gb"),
            "{text}"
        );
        assert!(text.contains(&format!("{}: fragmented", g(gpu0, 0))), "{text}");
    } else {
        // Before 1.36 DRAExtendedResource is off: the server drops the classes'
        // extendedResourceName, and such a pod asks the device plugin, not DRA.
        fails_plugin_style = true;
    }
    let text = why("unpublished");
    assert!(text.contains("profile 3g.71gb is published by no node; published: 1g.10gb, 1g.10gb+me"), "{text}");
    let text = why("claim/nomatch");
    assert!(
        text.contains("0 matching devices on 0 nodes") && text.contains("the selectors match no published device"),
        "{text}"
    );
    let json: Value = serde_json::from_str(&kubectl_migdra_ok(&kc, &["why", "frag", "-n", NS, "-o", "json"])).unwrap();
    let kinds: Vec<&str> = json["claims"][0]["requests"][0]["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["fragmented", "full"], "{json}");

    // usage: every allocated claim, at its placement, and nothing else.
    let text = kubectl_migdra_ok(&kc, &["usage"]);
    println!("kubectl migdra usage:\n{text}");
    let usage: Value = serde_json::from_str(&kubectl_migdra_ok(&kc, &["usage", "-o", "json"])).unwrap();
    let mut drawn = BTreeMap::new();
    for gpu in usage["nodes"][0]["gpus"].as_array().unwrap() {
        let slices = gpu["slices"].as_str().unwrap();
        for h in gpu["holders"].as_array().unwrap() {
            let (start, size) =
                (h["placementStart"].as_u64().unwrap() as usize, h["placementSize"].as_u64().unwrap() as usize);
            let letter = h["letter"].as_str().unwrap();
            assert_eq!(&slices[start..start + size], letter.repeat(size), "{gpu}");
            drawn.insert(h["claim"].as_str().unwrap().to_string(), h["device"].as_str().unwrap().to_string());
        }
        let held: usize =
            gpu["holders"].as_array().unwrap().iter().map(|h| h["placementSize"].as_u64().unwrap() as usize).sum();
        assert_eq!(slices.chars().filter(|c| *c != '.').count(), held, "{gpu}");
    }
    let want: BTreeMap<String, String> = cluster.allocations().await.into_iter().collect();
    assert_eq!(drawn, want, "usage draws exactly the allocated claims");
    let row = |p: &str| usage["profiles"].as_array().unwrap().iter().find(|r| r["profile"] == p).cloned().unwrap();
    assert_eq!((row("7g.80gb")["inUse"].as_u64(), row("7g.80gb")["free"].as_u64()), (Some(1), Some(0)));
    assert_eq!((row("1g.10gb")["inUse"].as_u64(), row("1g.10gb")["free"].as_u64()), (Some(2), Some(5)));
    assert_eq!((row("3g.40gb")["inUse"].as_u64(), row("3g.40gb")["free"].as_u64()), (Some(0), Some(0)));

    // Bad input: one line each, exit 2 for what the user typed, 1 for the cluster.
    let fails = |args: &[&str], kubeconfig: &std::path::Path, code: i32, want: &str| {
        let out = kubectl_migdra(kubeconfig, args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    };
    fails(&["why", "no-such-pod", "-n", NS], &kc, 2, "pod team-a/no-such-pod not found");
    if fails_plugin_style {
        fails(&["why", "plugin-style", "-n", NS], &kc, 2, "pod team-a/plugin-style has no resource claims");
    }
    fails(&["why", "deploy/x", "-n", NS], &kc, 2, "unknown kind \"deploy\"");
    cluster.create_device_plugin_pod("no-claims", "cpu").await;
    fails(&["why", "no-claims", "-n", NS], &kc, 2, "pod team-a/no-claims has no resource claims");
    cluster.create_driver_class("other-driver", "gpu.example.com").await;
    create_claim(&cluster.claims(), "other", "other-driver", &[]).await;
    cluster.create_pod("other", "", Some("other")).await;
    fails(&["why", "other", "-n", NS], &kc, 2, "pod team-a/other has no claim for mig.slinky.slurm.net devices");
    fails(&["usage", "--driver-name", "other.example.com"], &kc, 1, "no node publishes other.example.com devices");
    let dead = kc.parent().unwrap().join("dead-kubeconfig");
    let text = std::fs::read_to_string(&kc).unwrap();
    let port = text.split("https://").nth(1).and_then(|r| r.split(['/', '\n', '"']).next()).unwrap().to_string();
    std::fs::write(&dead, text.replace(&port, "127.0.0.1:9")).unwrap();
    fails(&["usage"], &dead, 1, "failed to read ResourceSlices from https://127.0.0.1:9");
}

/// A pod of `claims` (`{"name", "resourceClaimName" | "resourceClaimTemplateName"}`), one
/// container using them all, with `spec` merged into its spec (nodeSelector, affinity, ...).
async fn create_pod_with(pods: &Api<Pod>, name: &str, claims: &[Value], spec: Value) {
    let uses: Vec<Value> = claims.iter().map(|c| json!({"name": c["name"]})).collect();
    let mut pod = json!({
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": false,
            "resourceClaims": claims,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": uses}}]
        }
    });
    for (k, v) in spec.as_object().unwrap() {
        pod["spec"][k] = v.clone();
    }
    pods.create(&PostParams::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
}

/// `kubectl migdra why` where the answer is on the Node side or across a pod's claims, on three
/// nodes of mixed models: gpu-a (2 × H100, migdra), gpu-b (1 × A100-40GB, migdra; tainted, then
/// NotReady), gpu-c (opted in to migdra, which is not running there). One pending pod per class of
/// answer: a two-claim pod that fits one claim but not both, a GPU whose placements are held by
/// claims of the same profile (a pod pinned to it), a nodeSelector, a required node affinity, untolerated node taints,
/// a NotReady node, a node that publishes nothing, a claim allocated on another node, the
/// project's own `notebook-1g` template, and a pod no scheduler has tried. Every expected line
/// is checked before the test fails, so one run on an older `kubectl migdra` lists all it gets
/// wrong. Then `usage` by node and by node label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_migdra_why_reads_nodes_and_whole_pods_on_several_nodes() {
    let _serial = SERIAL.lock().await;
    let cp = ControlPlane::start().await;
    println!("control plane: {} (started in {:.1?})", cp.versions, cp.startup);
    let client = cp.client().await;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    for file in ["daemonset/base/deviceclasses.yaml", "daemonset/examples/claim-templates.yaml"] {
        apply(&client, &repo().join(file), NS).await;
    }
    let nodes_api: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for (name, pool) in [("gpu-a", "a"), ("gpu-b", "b"), ("gpu-c", "c")] {
        create_node(&client, name).await;
        let labels = json!({"metadata": {"labels": {"pool": pool, format!("{DRIVER}/enabled"): "true"}}});
        nodes_api.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&labels)).await.unwrap();
    }
    let kc = cp.kubeconfig().to_path_buf();
    let node_a = NodeDir::new().named("gpu-a").simulate("h100-80gb:2").kubeconfig(kc.clone());
    let node_b = NodeDir::new().named("gpu-b").simulate("a100-40gb:1").kubeconfig(kc.clone());
    let _daemons = [node_a.serve().ready().await, node_b.serve().ready().await];
    let explain = || cp.logs();
    let published = pool(&client, "gpu-a", Duration::from_secs(60), explain).await.0;
    pool(&client, "gpu-b", Duration::from_secs(60), explain).await;
    // The minor of gpu-a's GPU with Slurm index k, as device names carry it.
    let minor_of = |k: i64| -> u32 {
        let d = published
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.attributes.as_ref().and_then(|a| a.get("slurmGpuIndex")).and_then(|a| a.int) == Some(k));
        DeviceName::parse(&d.unwrap().name).unwrap().minor()
    };
    let (s0, s1) = (minor_of(0), minor_of(1));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let attr = |name: &str| format!("device.attributes[\"{DRIVER}\"].{name}");
    let by_name = |c: &str| json!({"name": c, "resourceClaimName": c});
    let outcome_of = async |name: &str| outcome(&pods, name, Duration::from_secs(60), || cp.logs()).await;

    // gpu-a: Slurm GPU 0 holds a 2g.20gb at 0 and the claim `shared` (a 1g.10gb, allocated to
    // the pod `first`) at 2: room for one 3g.40gb, at 4. Slurm GPU 1 holds two 3g.40gb, at 0 and
    // 4: every 3g.40gb placement there is taken by its own profile. The pods are bound to gpu-a by
    // its label: gpu-b's A100 has a 1g.10gb at 2 on Slurm GPU 0 too, where the scheduler once put
    // `shared` (seen on 1.36.3).
    let pin =
        |k: i64, start: u32| vec![format!("{} == {k} && {} == {start}", attr("slurmGpuIndex"), attr("placementStart"))];
    for (name, class, selectors) in [
        ("held-2g", "mig-2g.20gb", pin(0, 0)),
        ("held-3g-0", "mig-3g.40gb", pin(1, 0)),
        ("held-3g-4", "mig-3g.40gb", pin(1, 4)),
        ("shared", "mig-1g.10gb", pin(0, 2)),
    ] {
        create_claim(&claims, name, class, &selectors).await;
        let pod = if name == "shared" { "first" } else { name };
        create_pod_with(&pods, pod, &[by_name(name)], json!({"nodeSelector": {"pool": "a"}})).await;
        assert_eq!(outcome_of(pod).await, Outcome::Bound, "{pod}");
    }

    // gpu-b: a maintenance taint, then NotReady with the taint the node lifecycle controller adds
    // (it does not run here).
    let taints = json!({"spec": {"taints": [
        {"key": "example.com/maintenance", "value": "yes", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    ]}});
    nodes_api.patch("gpu-b", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&taints)).await.unwrap();
    let not_ready = json!({"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "the test"}
    ]}});
    nodes_api
        .patch_status("gpu-b", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&not_ready))
        .await
        .unwrap();

    // The pending pods.
    let template = |c: &str, t: &str| json!({"name": c, "resourceClaimTemplateName": t});
    let a100_1g = vec![format!("{} == \"1g.5gb\"", attr("profile"))];
    create_pod_with(&pods, "two-3g", &[template("one", "mig-3g-40gb"), template("two", "mig-3g-40gb")], json!({}))
        .await;
    create_pod_with(&pods, "sel-b", &[template("gpu", "mig-1g-10gb")], json!({"nodeSelector": {"pool": "b"}})).await;
    let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["c"]}]}
    ]}}});
    create_pod_with(&pods, "aff-c", &[template("gpu", "notebook-1g")], json!({"affinity": affinity})).await;
    create_claim(&claims, "on-b", "mig", &a100_1g).await;
    create_pod_with(&pods, "on-b", &[by_name("on-b")], json!({})).await;
    create_claim(&claims, "tied-b", "mig", &a100_1g).await;
    create_pod_with(&pods, "tied", &[by_name("shared"), by_name("tied-b")], json!({})).await;
    create_claim(&claims, "pinned-3g", "mig-3g.40gb", &[format!("{} == 1", attr("slurmGpuIndex"))]).await;
    create_pod_with(&pods, "pinned-3g", &[by_name("pinned-3g")], json!({})).await;
    create_claim(&claims, "untried", "mig-1g.10gb", &[]).await;
    create_pod_with(&pods, "untried", &[by_name("untried")], json!({"schedulerName": "no-such-scheduler"})).await;
    for pod in ["two-3g", "pinned-3g", "sel-b", "aff-c", "on-b", "tied"] {
        assert!(matches!(outcome_of(pod).await, Outcome::Unschedulable(_)), "{pod} was bound");
    }

    let gpu = |minor: u32, slurm: i64| {
        format!(
            "gpu-a gpu-{minor} (GPU {}, slurm {slurm})",
            node_a.minors().iter().position(|m| *m == u64::from(minor)).unwrap()
        )
    };
    let mut wrong = Vec::new();
    let mut expect = |pod: &str, wants: &[String]| {
        let text = kubectl_migdra_ok(&kc, &["why", pod, "-n", NS]);
        println!("kubectl migdra why {pod}:\n{text}");
        for want in wants {
            if !text.contains(want.as_str()) {
                wrong.push(format!("why {pod}: missing {want:?}"));
            }
        }
        // Each of these pods fits nowhere; the one no scheduler tried may well fit.
        for never in ["fits now", "0 matching devices"] {
            if text.contains(never) && pod != "untried" {
                wrong.push(format!("why {pod}: says {never:?}"));
            }
        }
        // The request's own selectors only: the class's CEL is in -o json.
        if text.contains("selector: device.driver") {
            wrong.push(format!("why {pod}: prints the class's CEL"));
        }
    };
    let silent = "opted in to migdra but publishing no devices: gpu-c".to_string();
    expect(
        "two-3g",
        &[
            format!("fits alone, not beside the other requests: {}", gpu(s0, 0)),
            "no node takes all 2 pending requests at once".into(),
            silent.clone(),
        ],
    );
    expect(
        "pinned-3g",
        &[
            format!("{}: taken: every matching device is held, by {NS}/held-3g-", gpu(s1, 1)),
            format!("pinned to Slurm GPU 1 (slurmGpuIndex); without the pin it would fit on {}", gpu(s0, 0)),
        ],
    );
    expect("sel-b", &["gpu-a: the pod cannot go there: nodeSelector pool=b: the node has pool=a".into()]);
    expect(
        "aff-c",
        &[
            "gpu-a: the pod cannot go there: required node affinity: none of its terms matches".into(),
            "matching devices on 2 nodes".into(),
            silent.clone(),
        ],
    );
    expect(
        "on-b",
        &[
            "gpu-b: the pod cannot go there: taint example.com/maintenance=yes:NoSchedule not tolerated; \
             taint node.kubernetes.io/not-ready:NoSchedule not tolerated"
                .into(),
            "NotReady: gpu-b".into(),
        ],
    );
    expect(
        "tied",
        &[
            "claim shared is allocated on node gpu-a: the pod can only run there".into(),
            "claim shared of the pod is allocated on node gpu-a".into(),
        ],
    );
    expect("untried", &["the scheduler has not tried the pod yet (no PodScheduled condition)".into()]);

    let out = kubectl_migdra(&kc, &["why", "pinned-3g", "-n", NS, "-o", "json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let request = &json["claims"][0]["requests"][0];
    let class_cel = request["classSelectors"][0].as_str().unwrap_or_default();
    if !class_cel.contains("profile == \"3g.40gb\"") || request["selectors"].as_array().map(Vec::len) != Some(1) {
        wrong.push(format!("why pinned-3g -o json: class and request selectors apart: {request}"));
    }

    // usage: the silent node named; filtered by node name and by node label.
    let text = kubectl_migdra_ok(&kc, &["usage"]);
    if !text.contains("NODE gpu-c  opted in to migdra, publishes nothing") {
        wrong.push(format!("usage: gpu-c not named:\n{text}"));
    }
    // What the command says, or (on an older kubectl migdra) its error, for the checks below.
    let said = |args: &[&str]| {
        let out = kubectl_migdra(&kc, args);
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let text = said(&["usage", "--summary"]);
    println!("kubectl migdra usage --summary:\n{text}");
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    for want in [
        vec!["gpu-a", "2", "11/16", "4", "0"],
        vec!["gpu-b", "1", "0/8", "0", "0"],
        vec!["gpu-c", "-", "publishes", "nothing", "-", "-"],
    ] {
        if !rows.contains(&want) {
            wrong.push(format!("usage --summary: no row {want:?}:\n{text}"));
        }
    }
    let nodes_of = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["usage", "-o", "json"];
        all.extend(args);
        let json: Value = serde_json::from_str(&said(&all)).unwrap_or_default();
        let nodes = json["nodes"].as_array().into_iter().flatten();
        nodes.map(|n| n["node"].as_str().unwrap_or_default().to_string()).collect()
    };
    for (args, want) in [
        (&["--node", "gpu-b"][..], vec!["gpu-b"]),
        (&["--node", "gpu-a,gpu-b"][..], vec!["gpu-a", "gpu-b"]),
        (&["-l", "pool=a"][..], vec!["gpu-a"]),
        (&["-l", "pool in (a,b)"][..], vec!["gpu-a", "gpu-b"]),
    ] {
        let got = nodes_of(args);
        if got != want {
            wrong.push(format!("usage {args:?}: nodes {got:?}, want {want:?}"));
        }
    }
    // A selector the API server cannot parse: its words, one line, exit 2.
    let out = kubectl_migdra(&kc, &["usage", "-l", "pool in"]);
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(2) || !err.contains("-l \"pool in\"") || err.lines().count() != 1 {
        wrong.push(format!("usage -l 'pool in': {:?} {err}", out.status.code()));
    }
    let out = kubectl_migdra(&kc, &["usage", "--node", "gpu-z"]);
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(2) || !err.contains("gpu-z") || err.lines().count() != 1 {
        wrong.push(format!("usage --node gpu-z: {:?} {err}", out.status.code()));
    }
    tenant_answers(&client, &cp, &mut wrong).await;
    assert!(wrong.is_empty(), "{} wrong:\n{}", wrong.len(), wrong.join("\n"));
}

/// `why` for a tenant whose rights end at their namespace (pods and claims there, as a namespace
/// admin has; no slices, classes or nodes): the pod's claims as written, said to be unevaluated,
/// not an error. Then with read access to the slices and classes too, but still only their
/// namespace's claims: a free device "looks free", never "fits now". `usage` refuses in one line.
async fn tenant_answers(client: &kube::Client, cp: &ControlPlane, wrong: &mut Vec<String>) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let rules = |resources: &[&str]| {
        let groups = ["", "resource.k8s.io"];
        json!([{"apiGroups": groups, "resources": resources, "verbs": ["get", "list"]}])
    };
    let subject = json!([{"kind": "User", "name": "tenant", "apiGroup": "rbac.authorization.k8s.io"}]);
    let role: Role = serde_json::from_value(
        json!({"metadata": {"name": "tenant", "namespace": NS}, "rules": rules(&["pods", "resourceclaims"])}),
    )
    .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({"metadata": {"name": "tenant", "namespace": NS},
        "subjects": subject, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"}}))
    .unwrap();
    Api::<Role>::namespaced(client.clone(), NS).create(&PostParams::default(), &role).await.unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), NS).create(&PostParams::default(), &binding).await.unwrap();
    let tenant = cp.impersonating_kubeconfig("tenant", &["system:authenticated"], &[]);
    let out = kubectl_migdra(&tenant, &["why", "two-3g", "-n", NS]);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("kubectl migdra why two-3g, as a tenant of {NS}:\n{text}");
    for want in [
        "request mig: class mig-3g.40gb, 1 device; devices not evaluated",
        "  scheduler: ",
        "note: ResourceSlices, DeviceClasses could not be read (forbidden)",
        "only the claims of namespace team-a could be read",
    ] {
        if !out.status.success() || !text.contains(want) {
            wrong.push(format!("why two-3g as a tenant: {:?}, missing {want:?}", out.status.code()));
        }
    }
    if text.matches("devices not evaluated").count() != 2 {
        wrong.push(format!("why two-3g as a tenant: not both claims' requests:\n{text}"));
    }
    let out = kubectl_migdra(&tenant, &["usage"]);
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success() || !err.contains("could not be read") || err.lines().count() != 1 {
        wrong.push(format!("usage as a tenant: {:?} {err}", out.status.code()));
    }

    // Read access to the cluster-scoped kinds, still not to other namespaces' claims.
    let reader: ClusterRole = serde_json::from_value(
        json!({"metadata": {"name": "tenant-reader"}, "rules": rules(&["resourceslices", "deviceclasses", "nodes"])}),
    )
    .unwrap();
    let role_ref = json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tenant-reader"});
    let binding: ClusterRoleBinding = serde_json::from_value(
        json!({"metadata": {"name": "tenant-reader"}, "subjects": subject, "roleRef": role_ref}),
    )
    .unwrap();
    Api::<ClusterRole>::all(client.clone()).create(&PostParams::default(), &reader).await.unwrap();
    Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await.unwrap();
    let text = String::from_utf8_lossy(&kubectl_migdra(&tenant, &["why", "untried", "-n", NS]).stdout).to_string();
    println!("kubectl migdra why untried, as a tenant who reads slices and classes:\n{text}");
    for want in ["looks free (a claim in a namespace you cannot read may hold it): gpu-a", "matching devices on"] {
        if !text.contains(want) || text.contains("fits now") || text.contains("not evaluated") {
            wrong.push(format!(
                "why untried as a tenant who reads slices: missing {want:?} (or says fits now):\n{text}"
            ));
        }
    }
}
