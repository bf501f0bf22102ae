//! The cluster's migdra devices as the scheduler sees them: the newest generation of each pool's
//! ResourceSlices, the claims allocated from them, and what those allocations consume of each
//! GPU's shared counters. A device is free exactly when the scheduler could allocate it now: it
//! is not allocated itself and every counter it consumes has that much left. That is the counter
//! model `tests/library/counter_proof.rs` proves equal to what NVML can create.

use super::wire::{self, Attribute, Slice, Taint};
use crate::mig::fit::{self, Consumer};
use k8s_openapi::api::resource::v1::ResourceClaim;
use std::collections::{BTreeMap, BTreeSet};

/// Counter amounts in base units, by counter name; `None` for one that cannot be read.
pub type Amounts = BTreeMap<String, Option<u128>>;

/// A claim by namespace and name, and the pod it is reserved for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct Holder {
    pub namespace: String,
    pub claim: String,
    /// The pod the claim is reserved for (its owner while not reserved), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    pub request: String,
}

impl Holder {
    /// `namespace/pod`, or `namespace/claim` for a claim no pod holds.
    pub fn who(&self) -> String {
        format!("{}/{}", self.namespace, self.pod.as_deref().unwrap_or(&self.claim))
    }
}

/// One published device.
#[derive(Debug, Clone)]
pub struct Device {
    pub name: String,
    pub attributes: BTreeMap<String, Attribute>,
    pub capacity: BTreeMap<String, wire::Value>,
    pub taints: Vec<Taint>,
    pub profile: Option<String>,
    /// Memory slices `(start, size)`; `None` for a whole GPU.
    pub placement: Option<(u32, u32)>,
    /// What it consumes, by counter set.
    pub consumes: BTreeMap<String, Amounts>,
    pub holder: Option<Holder>,
}

impl Consumer for Device {
    fn consumes(&self) -> Vec<(&str, &str, Option<u128>)> {
        let sets = self.consumes.iter();
        sets.flat_map(|(set, a)| a.iter().map(move |(c, &v)| (set.as_str(), c.as_str(), v))).collect()
    }
}

impl Device {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Taints that keep new claims off it (effect `None` only informs).
    pub fn taints(&self) -> impl Iterator<Item = &Taint> {
        self.taints.iter().filter(|t| t.effect != "None")
    }
}

/// One physical GPU and its devices, in published order.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub uuid: String,
    pub index: Option<i64>,
    pub minor: Option<i64>,
    pub slurm_index: Option<i64>,
    pub product: String,
    /// Whether its devices are MIG partitions or instances (else one whole GPU).
    pub mig: bool,
    pub memory_slices: u32,
    pub devices: Vec<Device>,
}

impl Gpu {
    /// `gpu-1 (GPU 0, slurm 0)`: how the outputs name it. First the name its devices start with
    /// (the minor, as in `kubectl get resourceclaim -o yaml`), then its NVML index (nvidia-smi's)
    /// and its Slurm index.
    pub fn label(&self) -> String {
        let n = |v: Option<i64>| v.map_or_else(|| "?".to_string(), |v| v.to_string());
        format!("gpu-{} (GPU {}, slurm {})", n(self.minor), n(self.index), n(self.slurm_index))
    }

    /// Every distinct taint on its devices, as `key=value:effect`.
    pub fn taints(&self) -> Vec<String> {
        let set: BTreeSet<String> = self.devices.iter().flat_map(|d| d.taints().map(taint_text)).collect();
        set.into_iter().collect()
    }

    /// Whether migdra marked it fallen off the bus.
    pub fn lost(&self, driver: &str) -> bool {
        let key = format!("{driver}/gpu-lost");
        self.devices.iter().any(|d| d.taints().any(|t| t.key == key))
    }

    /// Per memory slice, the holder of the device covering it (a held whole GPU covers all).
    pub fn slice_holders(&self) -> Vec<Option<&Holder>> {
        let mut cells = vec![None; self.memory_slices.max(1) as usize];
        for d in &self.devices {
            let Some(h) = &d.holder else { continue };
            let (start, size) = d.placement.unwrap_or((0, self.memory_slices.max(1)));
            for c in cells.iter_mut().skip(start as usize).take(size as usize) {
                *c = Some(h);
            }
        }
        cells
    }
}

/// One node's pool.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub gpus: Vec<Gpu>,
    /// Its counter sets, with what the allocated devices consume of them taken.
    pub pool: fit::Pool,
}

impl Node {
    /// Whether the scheduler could allocate `d` now, taints aside: not allocated, and its
    /// counters fit ([`fit::Pool::fits`]).
    pub fn fits(&self, d: &Device) -> bool {
        d.holder.is_none() && self.pool.fits(d)
    }

    /// The counters `d` needs more of than is left, as `(set, counter)`.
    pub fn short<'a>(&self, d: &'a Device) -> Vec<(&'a str, &'a str)> {
        self.pool.short(d)
    }

    /// The holders keeping `d` from being allocated: its own, and those of every device consuming
    /// a counter `d` needs more of than is left.
    pub fn blockers(&self, gpu: &Gpu, d: &Device) -> BTreeSet<Holder> {
        let mut out: BTreeSet<Holder> = d.holder.iter().cloned().collect();
        for (set, c) in self.short(d) {
            for other in gpu.devices.iter().filter(|o| o.holder.is_some()) {
                if other.consumes.get(set).and_then(|a| a.get(c)).is_some_and(|&v| v != Some(0)) {
                    out.extend(other.holder.clone());
                }
            }
        }
        out
    }
}

/// Every migdra node, by name.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub driver: String,
    pub nodes: Vec<Node>,
}

impl Cluster {
    /// The pools of `driver` in `slices` (newest generation only, as the scheduler reads them),
    /// with the allocations of `claims` on them. Takes the slices, as a big cluster's are large.
    pub fn build(driver: &str, slices: Vec<Slice>, claims: &[ResourceClaim]) -> Self {
        let mut pools: BTreeMap<String, (i64, Vec<Slice>)> = BTreeMap::new();
        for s in slices.into_iter().filter(|s| s.spec.driver == driver) {
            let (generation, kept) =
                pools.entry(s.spec.pool.name.clone()).or_insert((s.spec.pool.generation, Vec::new()));
            if s.spec.pool.generation > *generation {
                (*generation, *kept) = (s.spec.pool.generation, Vec::new());
            }
            if s.spec.pool.generation == *generation {
                kept.push(s);
            }
        }
        let mut holders = holders(driver, claims);
        let mut nodes = Vec::new();
        for (pool, (_, slices)) in pools {
            let mut capacity = BTreeMap::new();
            let mut gpus: Vec<Gpu> = Vec::new();
            for spec in slices.into_iter().map(|s| s.spec) {
                for set in spec.shared_counters {
                    capacity.insert(set.name, amounts(&set.counters));
                }
                for api in spec.devices {
                    let holder = holders.remove(&(pool.clone(), api.name.clone()));
                    let (device, gpu) = device(driver, api, holder);
                    match gpus.iter_mut().find(|g| g.uuid == gpu.uuid) {
                        Some(g) => {
                            g.memory_slices = g.memory_slices.max(gpu.memory_slices);
                            g.devices.push(device);
                        }
                        None => gpus.push(Gpu { devices: vec![device], ..gpu }),
                    }
                }
            }
            gpus.sort_by_key(|g| (g.index.unwrap_or(i64::MAX), g.uuid.clone()));
            let mut counters = fit::Pool::new(capacity);
            for d in gpus.iter().flat_map(|g| &g.devices).filter(|d| d.holder.is_some()) {
                counters.take(d);
            }
            nodes.push(Node { name: pool, gpus, pool: counters });
        }
        Self { driver: driver.to_string(), nodes }
    }

    /// Every profile any node publishes, sorted.
    pub fn profiles(&self) -> BTreeSet<&str> {
        self.devices().filter_map(|(_, _, d)| d.profile.as_deref()).collect()
    }

    /// Every device with its node and GPU.
    pub fn devices(&self) -> impl Iterator<Item = (&Node, &Gpu, &Device)> {
        self.nodes.iter().flat_map(|n| n.gpus.iter().flat_map(move |g| g.devices.iter().map(move |d| (n, g, d))))
    }
}

/// `key=value:effect`.
pub fn taint_text(t: &Taint) -> String {
    match &t.value {
        Some(v) => format!("{}={v}:{}", t.key, t.effect),
        None => format!("{}:{}", t.key, t.effect),
    }
}

/// (pool, device) → the claim holding it; admin access consumes nothing and is left out.
fn holders(driver: &str, claims: &[ResourceClaim]) -> BTreeMap<(String, String), Holder> {
    let mut out = BTreeMap::new();
    for c in claims {
        let status = c.status.as_ref();
        let results = status.and_then(|s| s.allocation.as_ref()).and_then(|a| a.devices.as_ref());
        let pod = status
            .and_then(|s| s.reserved_for.as_ref())
            .and_then(|r| r.iter().find(|r| r.resource == "pods"))
            .map(|r| r.name.clone())
            .or_else(|| c.metadata.owner_references.iter().flatten().find(|o| o.kind == "Pod").map(|o| o.name.clone()));
        for r in results.iter().flat_map(|d| d.results.iter().flatten()) {
            if r.driver != driver || r.admin_access == Some(true) {
                continue;
            }
            let holder = Holder {
                namespace: c.metadata.namespace.clone().unwrap_or_default(),
                claim: c.metadata.name.clone().unwrap_or_default(),
                pod: pod.clone(),
                request: r.request.clone(),
            };
            out.insert((r.pool.clone(), r.device.clone()), holder);
        }
    }
    out
}

/// Counter amounts read from quantities; one that cannot be read is `None`, which
/// [`fit::Pool`] decides on.
fn amounts(counters: &BTreeMap<String, wire::Value>) -> Amounts {
    let read = |v: &wire::Value| v.value.parse::<crate::mig::devices::Quantity>().ok().map(|q| q.base());
    counters.iter().map(|(k, v)| (k.clone(), read(v))).collect()
}

/// The device, and the GPU it belongs to as far as this device tells.
fn device(driver: &str, api: wire::Device, holder: Option<Holder>) -> (Device, Gpu) {
    let attr = |name: &str| {
        let attrs = &api.attributes;
        attrs.get(name).or_else(|| attrs.get(&format!("{driver}/{name}")))
    };
    let int = |name: &str| match attr(name) {
        Some(Attribute::Int(i)) => Some(*i),
        _ => None,
    };
    let text = |name: &str| match attr(name) {
        Some(Attribute::String(s)) => Some(s.clone()),
        _ => None,
    };
    let mig = text("type").as_deref() == Some("mig");
    let uuid = if mig { text("parentUUID") } else { text("uuid") }.unwrap_or_else(|| api.name.clone());
    let placement = match (int("placementStart"), int("placementSize")) {
        (Some(s), Some(n)) if mig => Some((s as u32, n as u32)),
        _ => None,
    };
    let memory_slices = placement.map_or_else(|| int("memorySlices").unwrap_or(1) as u32, |(s, n)| s + n);
    let gpu = Gpu {
        uuid,
        index: int("index"),
        minor: int("minor"),
        slurm_index: int("slurmGpuIndex"),
        product: text("productName").unwrap_or_default(),
        mig,
        memory_slices,
        devices: Vec::new(),
    };
    let consumes = api.consumes_counters.iter().map(|c| (c.counter_set.clone(), amounts(&c.counters))).collect();
    let profile = if mig { text("profile") } else { None };
    let wire::Device { name, attributes, capacity, taints, .. } = api;
    (Device { name, attributes, capacity, taints, profile, placement, consumes, holder }, gpu)
}

/// Test fixtures: what migdra publishes for H100 nodes, and claims allocated from it.
#[cfg(test)]
pub(super) mod fixture {
    use crate::kube::slices::{self, GpuSlices, Layout};
    use crate::mig::catalog::model;
    use crate::mig::counters::{self, CounterSet};
    use crate::mig::devices::{GpuMode, gpu_devices};
    use k8s_openapi::api::resource::v1 as api;

    pub const DRIVER: &str = "mig.slinky.slurm.net";

    /// The slices of a node with `gpus` dynamic H100-80GB (Slurm index = NVML index), as the
    /// API server sends them.
    pub fn node(name: &str, gpus: u32) -> Vec<super::Slice> {
        let slices = api_node(name, gpus);
        serde_json::from_value(serde_json::to_value(slices).expect("slices serialize")).expect("slices parse lean")
    }

    fn api_node(name: &str, gpus: u32) -> Vec<api::ResourceSlice> {
        let m = model("h100-80gb").expect("h100-80gb in the catalog");
        let gpus: Vec<GpuSlices> = (0..gpus)
            .map(|index| {
                let id = slices::tests::identity(m, index, index, format!("GPU-{name}-{index}"));
                let all = crate::mig::allowlist::Allowlist::all();
                GpuSlices {
                    minor: index,
                    counter_set: Some((counters::counter_set_name(index), CounterSet::for_model(m).capacity().clone())),
                    devices: gpu_devices(
                        m,
                        &id,
                        GpuMode::Dynamic,
                        false,
                        &[],
                        crate::mig::naming::NameStyle::Minor,
                        &all,
                    ),
                }
            })
            .collect();
        slices::build(DRIVER, name, None, 1, Layout::Split, &gpus).expect("slices build")
    }

    /// A claim `ns/name` for `pod`, allocated `device` on `node`.
    pub fn allocated(name: &str, pod: &str, node: &str, device: &str) -> api::ResourceClaim {
        let mut c = pending(name, "mig", &[]);
        c.status = Some(api::ResourceClaimStatus {
            allocation: Some(api::AllocationResult {
                devices: Some(api::DeviceAllocationResult {
                    results: Some(vec![api::DeviceRequestAllocationResult {
                        driver: DRIVER.into(),
                        pool: node.into(),
                        device: device.into(),
                        request: "gpu".into(),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                // As the scheduler writes it for node-local devices.
                node_selector: Some(k8s_openapi::api::core::v1::NodeSelector {
                    node_selector_terms: vec![k8s_openapi::api::core::v1::NodeSelectorTerm {
                        match_expressions: None,
                        match_fields: Some(vec![k8s_openapi::api::core::v1::NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![node.into()]),
                        }]),
                    }],
                }),
                ..Default::default()
            }),
            reserved_for: Some(vec![api::ResourceClaimConsumerReference {
                resource: "pods".into(),
                name: pod.into(),
                uid: format!("uid-{pod}"),
                ..Default::default()
            }]),
            ..Default::default()
        });
        c
    }

    /// A pending claim `default/name` with one request `gpu` of `class` and these selectors.
    pub fn pending(name: &str, class: &str, selectors: &[&str]) -> api::ResourceClaim {
        let selectors = selectors
            .iter()
            .map(|e| api::DeviceSelector { cel: Some(api::CELDeviceSelector { expression: e.to_string() }) })
            .collect();
        api::ResourceClaim {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            spec: Some(api::ResourceClaimSpec {
                devices: Some(api::DeviceClaim {
                    requests: Some(vec![api::DeviceRequest {
                        name: "gpu".into(),
                        exactly: Some(api::ExactDeviceRequest {
                            device_class_name: class.into(),
                            selectors: Some(selectors),
                            allocation_mode: Some("ExactCount".into()),
                            count: Some(1),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            }),
            status: None,
        }
    }

    /// migdra's DeviceClasses for an H100.
    pub fn classes() -> Vec<api::DeviceClass> {
        use crate::kube::device_classes as dc;
        let m = model("h100-80gb").expect("h100-80gb in the catalog");
        let profiles: Vec<String> = m.profiles.iter().map(|p| p.name.clone()).collect();
        let classes = dc::classes(DRIVER, &profiles, &dc::Naming::default()).expect("classes");
        classes.iter().map(dc::device_class).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::*;
    use super::*;

    #[test]
    fn allocations_consume_their_gpus_counters_only() {
        let slices = node("node-a", 2);
        let claims = [allocated("a", "pod-a", "node-a", "gpu-0-mig-3g40gb-9-4")];
        let c = Cluster::build(DRIVER, slices, &claims);
        assert_eq!(c.nodes.len(), 1);
        let n = &c.nodes[0];
        assert_eq!(n.gpus.len(), 2);
        assert_eq!(n.gpus[0].memory_slices, 8);
        let by_name = |g: usize, name: &str| n.gpus[g].devices.iter().find(|d| d.name() == name).unwrap();
        // The other 3g.40gb and the 4g.40gb overlap nothing held… except the 4g starts at 0 and
        // covers 0-3, free: it fits; the 7g covers all and does not.
        assert!(n.fits(by_name(0, "gpu-0-mig-3g40gb-9-0")));
        assert!(n.fits(by_name(0, "gpu-0-mig-4g40gb-5-0")));
        assert!(!n.fits(by_name(0, "gpu-0-mig-7g80gb-0-0")));
        assert!(!n.fits(by_name(0, "gpu-0-mig-1g10gb-19-5")));
        assert!(n.fits(by_name(1, "gpu-1-mig-7g80gb-0-0")), "GPU 1 is untouched");
        let blockers = n.blockers(&n.gpus[0], by_name(0, "gpu-0-mig-7g80gb-0-0"));
        assert_eq!(blockers.iter().map(|h| h.claim.as_str()).collect::<Vec<_>>(), ["a"]);
        let cells: String = n.gpus[0].slice_holders().iter().map(|h| if h.is_some() { 'x' } else { '.' }).collect();
        assert_eq!(cells, "....xxxx");
    }

    /// A capacity that cannot be read leaves nothing of its counter, as a counter set the slices
    /// do not carry does: `why` and `usage` never call such a device free.
    #[test]
    fn an_unreadable_capacity_or_a_missing_set_leaves_nothing() {
        let mut slices = node("node-a", 2);
        for set in slices.iter_mut().flat_map(|s| &mut s.spec.shared_counters).filter(|c| c.name == "gpu-0-counters") {
            for v in set.counters.values_mut() {
                v.value = "lots".into();
            }
        }
        for s in &mut slices {
            s.spec.shared_counters.retain(|c| c.name != "gpu-1-counters");
        }
        let c = Cluster::build(DRIVER, slices, &[]);
        let n = &c.nodes[0];
        assert_eq!(n.pool.left("gpu-0-counters", "memory-slice-0"), 0);
        let mig = n.gpus.iter().flat_map(|g| &g.devices).filter(|d| d.profile.is_some()).collect::<Vec<_>>();
        assert!(!mig.is_empty());
        assert!(mig.iter().all(|d| !n.fits(d)), "an unreadable or missing set fits nothing");
    }

    #[test]
    fn only_the_newest_generation_of_a_pool_counts() {
        let mut old = node("node-a", 1);
        let new = node("node-a", 2);
        for s in &mut old {
            s.spec.pool.generation = 0;
        }
        let all: Vec<_> = old.into_iter().chain(new).collect();
        let c = Cluster::build(DRIVER, all, &[]);
        assert_eq!(c.nodes[0].gpus.len(), 2);
        assert_eq!(c.nodes[0].gpus[0].devices.len(), c.nodes[0].gpus[1].devices.len());
    }
}
