//! The DRA devices one GPU offers, with the attributes, capacities and counter consumption of
//! the contracts in docs/design.md. Pure data: the publisher turns it into ResourceSlices.

use super::allowlist::Allowlist;
use super::catalog::{GiProfile, GpuModel};
use super::counters::{self, CounterSet, Counters};
use super::naming::{DeviceName, NameStyle, PublishedName};
use serde::Serialize;
use std::collections::BTreeMap;

/// The standard attribute for a PCI bus ID (KEP-4817).
pub const PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// The standard attribute for the PCIe root complex (`pci0000:15`): a claim's `matchAttribute`
/// constraint on it puts a MIG slice and a NIC of another driver under the same root.
pub const PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// The standard attribute for the NUMA node (KEP-6072, stable in 1.37; an int): the same
/// alignment with CPUs, memory and NICs by node.
pub const NUMA_NODE: &str = "resource.kubernetes.io/numaNode";
/// Attributes and capacities per device, everywhere (k8s `ResourceSliceMaxAttributesAndCapacitiesPerDevice`).
pub const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;

/// How migdra treats a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuMode {
    /// MIG off: the GPU is one device.
    Full,
    /// MIG on, migdra owns every instance and publishes every possible partition.
    Dynamic,
    /// MIG on, instances made by an administrator; migdra publishes exactly those.
    Static,
}

impl GpuMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "disabled",
            Self::Dynamic => "dynamic",
            Self::Static => "static",
        }
    }
}

/// Where a GPU sits on the host, as the kernel says (sysfs; simulated in tests). Each part is
/// published on all of the GPU's devices when known, and left out when not: a claim that
/// asks for it then finds no device rather than a wrong one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Topology {
    /// The PCIe root complex, `pci<domain>:<bus>` (the first directory under `/sys/devices`).
    pub pcie_root: Option<String>,
    /// The NUMA node; `None` where the kernel reports none (-1) or no file.
    pub numa_node: Option<u32>,
}

/// What the device model needs to know about one physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuIdentity {
    pub index: u32,
    pub minor: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    pub product_name: String,
    pub memory_mib: u64,
    pub driver_version: String,
    pub cuda_compute_capability: (u32, u32),
    /// The GPU's index in Slurm's GRES list; `None` when Slurm lists only its MIG instances.
    pub slurm_index: Option<u32>,
    /// What decided `slurm_index` (`admin-map`, `slurmd`, `gres.conf`, `nvml`).
    pub slurm_index_source: String,
    /// Slurm shards that stand for the whole GPU.
    pub shards_per_gpu: u32,
    pub topology: Topology,
}

/// A DRA device attribute value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttributeValue {
    Int(i64),
    Bool(bool),
    String(String),
    /// Semantic version 2.0.0.
    Version(String),
}

/// A capacity amount; memory in MiB, everything else a count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Quantity {
    Count(u64),
    MiB(u64),
}

/// The API server stores quantities in canonical form (`40960Mi` becomes `40Gi`, `1000` becomes
/// `1k`); writing that form ourselves means a read-back equals what we published, so the
/// publisher sees no false drift.
impl std::fmt::Display for Quantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Self::Count(0) | Self::MiB(0) => write!(f, "0"),
            Self::Count(n) => {
                let (mut n, mut unit) = (n, 0);
                while n % 1000 == 0 && unit < 6 {
                    n /= 1000;
                    unit += 1;
                }
                write!(f, "{n}{}", ["", "k", "M", "G", "T", "P", "E"][unit])
            }
            Self::MiB(n) => {
                let (mut n, mut unit) = (n, 0);
                while n % 1024 == 0 && unit < 4 {
                    n /= 1024;
                    unit += 1;
                }
                write!(f, "{n}{}", ["Mi", "Gi", "Ti", "Pi", "Ei"][unit])
            }
        }
    }
}

/// A quantity string that is not one migdra writes: a plain or decimal-suffixed count, or a
/// whole number of MiB with a binary suffix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("quantity {0:?} is not a count (16, 2k) or whole MiB (81152Mi, 40Gi)")]
pub struct QuantityError(pub String);

/// The inverse of `Display`, for reading back what the API server holds: `40Gi` is
/// `MiB(40960)`, `1k` is `Count(1000)`. Both scales of a quantity compare through [`Self::base`].
impl std::str::FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, QuantityError> {
        let bad = || QuantityError(s.to_string());
        let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (n, unit) = s.split_at(digits);
        let n: u64 = n.parse().map_err(|_| bad())?;
        let scale = |factor: u64, make: fn(u64) -> Self| n.checked_mul(factor).map(make).ok_or_else(bad);
        match unit {
            "" => Ok(Self::Count(n)),
            "k" => scale(1000, Self::Count),
            "M" => scale(1_000_000, Self::Count),
            "G" => scale(1_000_000_000, Self::Count),
            "T" => scale(1_000_000_000_000, Self::Count),
            "Mi" => Ok(Self::MiB(n)),
            "Gi" => scale(1 << 10, Self::MiB),
            "Ti" => scale(1 << 20, Self::MiB),
            "Pi" => scale(1 << 30, Self::MiB),
            _ => Err(bad()),
        }
    }
}

impl Quantity {
    /// The amount in its base unit: bytes for memory, the count otherwise.
    pub fn base(self) -> u128 {
        match self {
            Self::Count(n) => u128::from(n),
            Self::MiB(n) => u128::from(n) << 20,
        }
    }
}

/// One DRA device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Device {
    pub name: String,
    /// Bare keys live in the driver's domain; qualified ones (with `/`) stand as they are.
    pub attributes: BTreeMap<String, AttributeValue>,
    pub capacity: BTreeMap<String, Quantity>,
    /// The counter set this device draws from, and how much; `None` for devices that need no
    /// counters (MIG off, static instances).
    pub consumes: Option<(String, Counters)>,
    /// Set while the GPU (or this instance) is unhealthy ([`super::taints::apply`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<super::taints::Taint>,
}

/// A MIG instance that already exists (static mode, or one migdra made).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingInstance {
    pub profile_id: u32,
    pub start: u32,
    pub uuid: String,
    /// The instance's own index when Slurm lists it as a GPU (static MIG in gres.conf or AutoDetect).
    pub slurm_index: Option<u32>,
}

/// Semantic version from a driver or CUDA version: `580.95.05` → `580.95.5`, `9.0` → `9.0.0`.
pub fn semver(v: &str) -> String {
    let mut parts: Vec<String> =
        v.split('.').take(3).map(|p| p.trim().parse::<u64>().map_or_else(|_| "0".into(), |n| n.to_string())).collect();
    parts.resize(3, "0".into());
    parts.join(".")
}

/// Shards a partition of `size` memory slices stands for: ceil(size × shards / slices).
pub fn shards_for(size: u32, memory_slices: u32, shards_per_gpu: u32) -> u32 {
    (size * shards_per_gpu).div_ceil(memory_slices.max(1))
}

fn common(model: &GpuModel, gpu: &GpuIdentity, mode: GpuMode) -> BTreeMap<String, AttributeValue> {
    use AttributeValue::*;
    let (major, minor) = gpu.cuda_compute_capability;
    let mut attributes = BTreeMap::from([
        ("productName".into(), String(gpu.product_name.clone())),
        ("index".into(), Int(gpu.index.into())),
        ("minor".into(), Int(gpu.minor.into())),
        ("slurmGpuIndexSource".into(), String(gpu.slurm_index_source.clone())),
        ("migMode".into(), String(mode.as_str().into())),
        ("architecture".into(), String(model.architecture.clone())),
        ("cudaComputeCapability".into(), Version(semver(&format!("{major}.{minor}")))),
        ("driverVersion".into(), Version(semver(&gpu.driver_version))),
        (PCI_BUS_ID.into(), String(crate::pci::standard(&gpu.pci_bus_id))),
    ]);
    if let Some(i) = gpu.slurm_index {
        attributes.insert("slurmGpuIndex".into(), Int(i.into()));
    }
    if let Some(root) = &gpu.topology.pcie_root {
        attributes.insert(PCIE_ROOT.into(), String(root.clone()));
    }
    if let Some(node) = gpu.topology.numa_node {
        attributes.insert(NUMA_NODE.into(), Int(node.into()));
    }
    attributes
}

/// The whole GPU as one device; with `counters`, it consumes the GPU's entire counter set.
pub fn full_gpu_device(model: &GpuModel, gpu: &GpuIdentity, mode: GpuMode, counters: Option<&CounterSet>) -> Device {
    use AttributeValue::*;
    let mut attributes = common(model, gpu, mode);
    attributes.insert("type".into(), String("gpu".into()));
    attributes.insert("uuid".into(), String(gpu.uuid.clone()));
    attributes.insert("slurmShards".into(), Int(gpu.shards_per_gpu.into()));
    attributes.insert("memorySlices".into(), Int(model.memory_slices.into()));
    attributes.insert("computeSlices".into(), Int(model.compute_slices.into()));
    let cap = counters::resources(model);
    let engines = |k: &str| Quantity::Count(cap.get(k).copied().unwrap_or(0));
    let capacity = BTreeMap::from([
        ("multiprocessors".into(), Quantity::Count(model.multiprocessors.into())),
        ("memory".into(), Quantity::MiB(gpu.memory_mib)),
        ("copyEngines".into(), engines(counters::COPY_ENGINES)),
        ("decoders".into(), engines(counters::DECODERS)),
        ("encoders".into(), engines(counters::ENCODERS)),
        ("jpegEngines".into(), engines(counters::JPEG_ENGINES)),
        ("ofaEngines".into(), engines(counters::OFA_ENGINES)),
    ]);
    Device {
        name: DeviceName::Gpu { minor: gpu.minor }.to_string(),
        attributes,
        capacity,
        consumes: counters.map(|c| (counters::counter_set_name(gpu.minor), c.whole_gpu())),
        taints: Vec::new(),
    }
}

/// One MIG partition: `uuid` when the instance exists; with `counters`, it consumes its share of
/// the parent's counter set.
pub fn mig_device(
    model: &GpuModel,
    gpu: &GpuIdentity,
    mode: GpuMode,
    profile: &GiProfile,
    start: u32,
    uuid: Option<&str>,
    counters: Option<&CounterSet>,
) -> Device {
    use AttributeValue::*;
    let mut attributes = common(model, gpu, mode);
    let ints = [
        ("profileId", profile.id),
        ("placementStart", start),
        ("placementSize", profile.memory_slices),
        ("memorySlices", profile.memory_slices),
        ("computeSlices", profile.compute_slices),
        ("slurmShards", shards_for(profile.memory_slices, model.memory_slices, gpu.shards_per_gpu)),
    ];
    attributes.extend(ints.map(|(k, v)| (k.to_string(), Int(v.into()))));
    attributes.insert("type".into(), String("mig".into()));
    attributes.insert("profile".into(), String(profile.name.clone()));
    attributes.insert("parentUUID".into(), String(gpu.uuid.clone()));
    if let Some(uuid) = uuid {
        attributes.insert("uuid".into(), String(uuid.to_string()));
    }
    let e = &profile.engines;
    let capacity = BTreeMap::from([
        ("multiprocessors".into(), Quantity::Count(profile.multiprocessors.into())),
        ("memory".into(), Quantity::MiB(profile.memory_mib)),
        ("copyEngines".into(), Quantity::Count(e.copy.into())),
        ("decoders".into(), Quantity::Count(e.decoders.into())),
        ("encoders".into(), Quantity::Count(e.encoders.into())),
        ("jpegEngines".into(), Quantity::Count(e.jpeg.into())),
        ("ofaEngines".into(), Quantity::Count(e.ofa.into())),
    ]);
    Device {
        name: DeviceName::mig(gpu.minor, &profile.name, profile.id, start).to_string(),
        attributes,
        capacity,
        consumes: counters.map(|c| (counters::counter_set_name(gpu.minor), c.mig(profile, start))),
        taints: Vec::new(),
    }
}

/// The partitions a dynamic GPU publishes: every placement of each profile the allowlist lets
/// through, and every instance that exists whatever its profile (it is in use, and hiding it would
/// let the scheduler hand its memory slices to someone else).
pub fn dynamic_partitions<'m>(
    model: &'m GpuModel,
    existing: &[ExistingInstance],
    profiles: &Allowlist,
) -> Vec<(&'m GiProfile, u32)> {
    let exists = |p: &GiProfile, s: u32| existing.iter().any(|e| e.profile_id == p.id && e.start == s);
    model
        .profiles
        .iter()
        .flat_map(|p| p.placements.iter().map(move |&s| (p, s)))
        .filter(|&(p, s)| profiles.allows(p) || exists(p, s))
        .collect()
}

/// The counter set of a dynamic GPU: exactly what its published partitions need.
pub fn dynamic_counters(model: &GpuModel, existing: &[ExistingInstance], profiles: &Allowlist) -> CounterSet {
    CounterSet::for_partitions(model, &dynamic_partitions(model, existing, profiles))
}

/// Every device of one GPU.
///
/// - `Full`: the GPU alone.
/// - `Dynamic`: the [`dynamic_partitions`] consuming the [`dynamic_counters`], plus the whole GPU
///   when it may be used whole (`whole_gpu`: the operator allows MIG mode changes on Hopper and
///   newer). Partitions that exist already carry their UUID.
/// - `Static`: exactly the existing instances.
///
/// `names`: with [`NameStyle::Slurm`], the whole GPU and static instances carry their Slurm index
/// in front of their names; dynamic partitions never do, so a partition keeps its name when its
/// instance comes and goes.
pub fn gpu_devices(
    model: &GpuModel,
    gpu: &GpuIdentity,
    mode: GpuMode,
    whole_gpu: bool,
    existing: &[ExistingInstance],
    names: NameStyle,
    profiles: &Allowlist,
) -> Vec<Device> {
    let at = |p: &GiProfile, s: u32| existing.iter().find(|e| e.profile_id == p.id && e.start == s);
    let uuid_at = |p: &GiProfile, s: u32| at(p, s).map(|e| e.uuid.as_str());
    let with_mig_index = |mut d: Device, e: Option<&ExistingInstance>| {
        if let Some(i) = e.and_then(|e| e.slurm_index) {
            d.attributes.insert("slurmMigIndex".into(), AttributeValue::Int(i.into()));
        }
        d
    };
    let whole = |counters: Option<&CounterSet>| {
        let mut d = full_gpu_device(model, gpu, mode, counters);
        d.name = PublishedName::new(names, DeviceName::Gpu { minor: gpu.minor }, gpu.slurm_index).to_string();
        d
    };
    match mode {
        GpuMode::Full => vec![whole(None)],
        GpuMode::Dynamic => {
            let partitions = dynamic_partitions(model, existing, profiles);
            let set = CounterSet::for_partitions(model, &partitions);
            let mut out = Vec::new();
            if whole_gpu && model.supports_mig_mode_toggle() {
                out.push(whole(Some(&set)));
            }
            for (p, s) in partitions {
                out.push(with_mig_index(mig_device(model, gpu, mode, p, s, uuid_at(p, s), Some(&set)), at(p, s)));
            }
            out
        }
        GpuMode::Static => existing
            .iter()
            .filter_map(|e| {
                let p = model.profile(e.profile_id)?;
                let mut d = with_mig_index(mig_device(model, gpu, mode, p, e.start, Some(&e.uuid), None), Some(e));
                let partition = DeviceName::mig(gpu.minor, &p.name, p.id, e.start);
                d.name = PublishedName::new(names, partition, e.slurm_index).to_string();
                Some(d)
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mig::catalog::{model, models};
    use crate::names::is_dns_label;

    fn identity(model: &GpuModel) -> GpuIdentity {
        GpuIdentity {
            index: 2,
            minor: 3,
            uuid: "GPU-11111111-2222-3333-4444-555555555555".into(),
            pci_bus_id: "00000000:3B:00.0".into(),
            product_name: model.product_name.clone(),
            memory_mib: model.memory_mib,
            driver_version: "580.95.05".into(),
            cuda_compute_capability: model.cuda_compute_capability,
            slurm_index: Some(5),
            slurm_index_source: "gres.conf".into(),
            shards_per_gpu: model.memory_slices,
            topology: Topology { pcie_root: Some("pci0000:37".into()), numa_node: Some(1) },
        }
    }

    /// An existing instance in every placement of every profile, each listed by Slurm at `slurm_index`.
    fn in_every_placement(m: &GpuModel, slurm_index: u32) -> Vec<ExistingInstance> {
        m.profiles
            .iter()
            .flat_map(|p| p.placements.iter().map(|&start| (p.id, start)))
            .map(|(profile_id, start)| ExistingInstance {
                profile_id,
                start,
                uuid: "MIG-x".into(),
                slurm_index: Some(slurm_index),
            })
            .collect()
    }

    #[test]
    fn a_topology_is_on_every_device_of_its_gpu_and_left_out_when_unknown() {
        let m = model("h100-80gb").unwrap();
        let mut gpu = identity(m);
        let with = gpu_devices(m, &gpu, GpuMode::Dynamic, true, &[], NameStyle::Slurm, &Allowlist::all());
        assert!(with.iter().all(|d| d.attributes[PCIE_ROOT] == AttributeValue::String("pci0000:37".into())
            && d.attributes[NUMA_NODE] == AttributeValue::Int(1)));
        gpu.topology = Topology::default();
        let without = gpu_devices(m, &gpu, GpuMode::Dynamic, true, &[], NameStyle::Slurm, &Allowlist::all());
        assert_eq!(with.len(), without.len());
        assert!(without.iter().all(|d| !d.attributes.contains_key(PCIE_ROOT) && !d.attributes.contains_key(NUMA_NODE)));
    }

    #[test]
    fn every_device_of_every_model_is_within_the_limits() {
        for m in models() {
            let gpu = identity(m);
            // Every attribute at once: an existing instance that Slurm lists in every placement.
            let existing = in_every_placement(m, 1);
            for d in gpu_devices(m, &gpu, GpuMode::Dynamic, true, &existing, NameStyle::Slurm, &Allowlist::all()) {
                assert!(is_dns_label(&d.name), "{}", d.name);
                assert!(d.attributes.len() + d.capacity.len() <= MAX_ATTRIBUTES_AND_CAPACITIES, "{}", d.name);
                let (set, used) = d.consumes.as_ref().expect("dynamic devices consume counters");
                assert_eq!(set, "gpu-3-counters");
                assert!(used.len() <= 32);
                for (k, v) in &d.attributes {
                    if let AttributeValue::String(s) | AttributeValue::Version(s) = v {
                        assert!(s.len() <= 64, "{k}");
                    }
                    let bare = k.rsplit('/').next().unwrap();
                    assert!(bare.len() <= 32 && bare.chars().all(|c| c.is_ascii_alphanumeric()), "{k}");
                }
            }
        }
    }

    #[test]
    fn h100_dynamic_devices_carry_the_contract_attributes() {
        let m = model("h100-80gb").unwrap();
        let gpu = identity(m);
        let devices = gpu_devices(m, &gpu, GpuMode::Dynamic, true, &[], NameStyle::Minor, &Allowlist::all());
        assert_eq!(devices.len(), 1 + 7 + 7 + 4 + 3 + 2 + 1 + 1);
        let d = devices.iter().find(|d| d.name == "gpu-3-mig-3g40gb-9-4").unwrap();
        let a = |k: &str| d.attributes[k].clone();
        assert_eq!(a("type"), AttributeValue::String("mig".into()));
        assert_eq!(a("profileId"), AttributeValue::Int(9));
        assert_eq!(a("placementStart"), AttributeValue::Int(4));
        assert_eq!(a("placementSize"), AttributeValue::Int(4));
        assert_eq!(a("slurmGpuIndex"), AttributeValue::Int(5));
        assert_eq!(a("slurmShards"), AttributeValue::Int(4));
        assert_eq!(a("driverVersion"), AttributeValue::Version("580.95.5".into()));
        assert_eq!(a("cudaComputeCapability"), AttributeValue::Version("9.0.0".into()));
        assert_eq!(a(PCI_BUS_ID), AttributeValue::String("0000:3b:00.0".into()), "the standard form, not NVML's");
        assert_eq!(a(PCIE_ROOT), AttributeValue::String("pci0000:37".into()));
        assert_eq!(a(NUMA_NODE), AttributeValue::Int(1));
        assert!(!d.attributes.contains_key("uuid"), "no UUID before the instance exists");
        assert_eq!(d.capacity["memory"].to_string(), "40192Mi");
        assert_eq!(devices[0].name, "gpu-3");
    }

    #[test]
    fn whole_gpu_is_offered_on_mig_gpus_only_where_the_mode_may_change() {
        let a100 = model("a100-40gb").unwrap();
        let gpu = identity(a100);
        assert!(
            gpu_devices(a100, &gpu, GpuMode::Dynamic, true, &[], NameStyle::Minor, &Allowlist::all())
                .iter()
                .all(|d| d.name != "gpu-3")
        );
        let full = gpu_devices(a100, &gpu, GpuMode::Full, false, &[], NameStyle::Minor, &Allowlist::all());
        assert_eq!(full.len(), 1);
        assert!(full[0].consumes.is_none());
    }

    #[test]
    fn static_mode_publishes_exactly_the_existing_instances_with_uuids() {
        let m = model("h100-80gb").unwrap();
        let existing = [
            ExistingInstance { profile_id: 19, start: 6, uuid: "MIG-a".into(), slurm_index: Some(9) },
            ExistingInstance { profile_id: 19, start: 5, uuid: "MIG-b".into(), slurm_index: None },
        ];
        let mut gpu = identity(m);
        gpu.slurm_index = None;
        let devices = gpu_devices(m, &gpu, GpuMode::Static, true, &existing, NameStyle::Minor, &Allowlist::all());
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0].name, "gpu-3-mig-1g10gb-19-6");
        let a = &devices[0].attributes;
        assert_eq!(a["uuid"], AttributeValue::String("MIG-a".into()));
        assert_eq!(a["slurmShards"], AttributeValue::Int(1));
        assert_eq!(a["slurmMigIndex"], AttributeValue::Int(9));
        assert_eq!(a["slurmGpuIndexSource"], AttributeValue::String("gres.conf".into()));
        assert!(!a.contains_key("slurmGpuIndex"), "Slurm lists only the instances, not their GPU");
        assert!(!devices[1].attributes.contains_key("slurmMigIndex"));
    }

    #[test]
    fn slurm_names_prefix_whole_gpus_and_static_instances_only() {
        let m = model("h100-80gb").unwrap();
        let gpu = identity(m);
        let existing = [
            ExistingInstance { profile_id: 19, start: 6, uuid: "MIG-a".into(), slurm_index: Some(9) },
            ExistingInstance { profile_id: 19, start: 5, uuid: "MIG-b".into(), slurm_index: None },
        ];
        let names = |mode, style| -> Vec<String> {
            gpu_devices(m, &gpu, mode, true, &existing, style, &Allowlist::all()).into_iter().map(|d| d.name).collect()
        };
        assert_eq!(names(GpuMode::Full, NameStyle::Slurm), ["0005-gpu-3"]);
        assert_eq!(names(GpuMode::Full, NameStyle::Minor), ["gpu-3"]);
        assert_eq!(names(GpuMode::Static, NameStyle::Slurm), ["0009-gpu-3-mig-1g10gb-19-6", "gpu-3-mig-1g10gb-19-5"]);
        let dynamic = names(GpuMode::Dynamic, NameStyle::Slurm);
        assert_eq!(dynamic[0], "0005-gpu-3", "the whole GPU of a dynamic GPU is a whole GPU");
        assert!(dynamic[1..].iter().all(|n| n.starts_with("gpu-3-mig-")), "partitions keep their names: {dynamic:?}");
        assert_eq!(dynamic[1..], names(GpuMode::Dynamic, NameStyle::Minor)[1..]);
        // Every static instance of every model, at the widest index and a large minor: DNS labels.
        for m in models() {
            let mut gpu = identity(m);
            gpu.minor = 255;
            let all = in_every_placement(m, crate::mig::naming::MAX_SLURM_INDEX);
            for d in gpu_devices(m, &gpu, GpuMode::Static, false, &all, NameStyle::Slurm, &Allowlist::all()) {
                assert!(d.name.starts_with("9999-gpu-255-mig-") && is_dns_label(&d.name), "{}", d.name);
            }
        }
    }

    #[test]
    fn quantities_are_written_in_the_api_servers_canonical_form() {
        // Pairs from apimachinery v0.36.3's canonicalisation.
        for (q, want) in [
            (Quantity::MiB(40960), "40Gi"),
            (Quantity::MiB(1024), "1Gi"),
            (Quantity::MiB(1_048_576), "1Ti"),
            (Quantity::MiB(81152), "81152Mi"),
            (Quantity::MiB(9856), "9856Mi"),
            (Quantity::MiB(0), "0"),
            (Quantity::Count(1000), "1k"),
            (Quantity::Count(2000), "2k"),
            (Quantity::Count(1500), "1500"),
            (Quantity::Count(132), "132"),
            (Quantity::Count(0), "0"),
        ] {
            assert_eq!(q.to_string(), want);
        }
    }

    #[test]
    fn versions_become_semver() {
        assert_eq!(semver("580.95.05"), "580.95.5");
        assert_eq!(semver("12.0"), "12.0.0");
        assert_eq!(semver("550"), "550.0.0");
        assert_eq!(shards_for(3, 12, 12), 3);
        assert_eq!(shards_for(1, 8, 10), 2);
    }

    #[test]
    fn quantities_read_back_as_written() {
        for n in [0u64, 1, 7, 16, 999, 1000, 1024, 2000, 81152, 40960, 1 << 20, 3_000_000, 5_000_000_000] {
            for q in [Quantity::Count(n), Quantity::MiB(n)] {
                let back: Quantity = q.to_string().parse().unwrap();
                assert_eq!(back.base(), q.base(), "{q:?} written as {q}");
            }
        }
        assert_eq!("40Gi".parse(), Ok(Quantity::MiB(40960)));
        assert_eq!("1k".parse(), Ok(Quantity::Count(1000)));
        for bad in ["", "Mi", "1.5Gi", "4Ki", "-1", "1e3", "18446744073709551615k"] {
            let e = bad.parse::<Quantity>().unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }
}
