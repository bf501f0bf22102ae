//! The ResourceSlices of one node's pool, built from the pure device model, and the API server's
//! rules for them. Pure: no client, no I/O.
//!
//! # Layouts
//! - [`Layout::Combined`] (API servers up to 1.34): a slice holds counter sets *and* the devices
//!   that consume them; a device may consume only sets of its own slice. Limits per slice: 128
//!   devices, 32 counters across all sets, 1024 counters consumed summed over its devices.
//! - [`Layout::Split`] (1.35 and later): counter sets live in counter-only slices (at most 8 sets,
//!   32 counters each), devices in device-only slices (at most 64 devices when any consumes
//!   counters, 128 otherwise), all in the same pool and generation. 1.34-style slices are invalid
//!   on 1.35 and the other way round, so the layout follows the server's version.
//!
//! Everywhere: at most 32 attributes + capacities per device, at most 2 counter sets consumed per
//! device (1.35+), at most 32 counters per consumption.
//!
//! # Packing
//! Whole GPUs are packed greedily, in GPU order: a GPU's devices are never spread over two slices
//! (a GPU that alone exceeds a limit is an error naming it). Devices that consume counters and
//! those that do not (MIG off, static MIG) go into separate slices, so the 64-device cap of
//! counter-consuming slices does not apply to the latter.
//!
//! # Names
//! `<node>-<driver, dots as dashes>-<index as 5 lower-case hex digits>`, e.g.
//! `node-a-mig-slinky-slurm-net-00000`. From 1.36 the scheduler tries a pool's device slices in
//! the lexicographic order of their names (docs `dra-allocator-order.md`). Every slice of a pool
//! shares the prefix, so the fixed-width index alone decides that order: device slices come first,
//! in GPU order, and counter-only slices (which the allocator does not iterate) after them. The Go
//! helper's `<index>-<driver>-<owner>-` generateName puts the index first; with a single pool per
//! name prefix both sort the same, and ours keeps a node's slices together in `kubectl get`.
//! Names are deterministic, so a republish of the same layout updates slices in place. A prefix
//! that would push the name past 253 characters is cut and made unique again with a hash.

pub use taints::{TaintSet, keep_taint_times, strip_taints, taints_of};

use crate::mig::counters::{self, Counters};
use crate::mig::devices::{AttributeValue, Device};
use crate::names::{MAX_SUBDOMAIN_LEN, fnv1a64};
use k8s_openapi::api::resource::v1 as api;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use std::collections::BTreeMap;

mod fitting;
mod ranking;
mod taints;
mod validate;
pub use fitting::keep_fitting;
pub use ranking::rank_best_fit;
pub use validate::{is_semver, validate};

/// Devices per slice (`ResourceSliceMaxDevices`).
pub const MAX_DEVICES: usize = 128;
/// Devices per slice when any device consumes counters or has taints, 1.35+
/// (`ResourceSliceMaxDevicesWithTaintsOrConsumesCounters`).
pub const MAX_DEVICES_WITH_COUNTERS: usize = 64;
/// Taints per device: 4 up to 1.34, 16 from 1.35 (`DeviceTaintsMaxLength`); the smaller holds
/// everywhere, and migdra puts at most one on a device.
pub const MAX_TAINTS_PER_DEVICE: usize = 4;
/// Counter sets per counter slice, 1.35+ (`ResourceSliceMaxCounterSets`).
pub const MAX_COUNTER_SETS: usize = 8;
/// Counters per counter set, 1.35+ (`ResourceSliceMaxCountersPerCounterSet`).
pub const MAX_COUNTERS_PER_SET: usize = 32;
/// Counter sets one device consumes, 1.35+ (`ResourceSliceMaxDeviceCounterConsumptionsPerDevice`).
pub const MAX_CONSUMPTIONS_PER_DEVICE: usize = 2;
/// Counters per consumption (`ResourceSliceMaxCountersPerDeviceCounterConsumption`); up to 1.34,
/// counters per device.
pub const MAX_COUNTERS_PER_CONSUMPTION: usize = 32;
/// Counters across all sets of a slice, up to 1.34 (`ResourceSliceMaxSharedCounters`).
pub const COMBINED_MAX_SHARED_COUNTERS: usize = 32;
/// Counters consumed, summed over a slice's devices, up to 1.34 (`ResourceSliceMaxDeviceCountersPerSlice`).
pub const COMBINED_MAX_CONSUMED_COUNTERS: usize = 1024;
/// Characters of a string or version attribute value.
pub const MAX_ATTRIBUTE_VALUE_LEN: usize = 64;
/// Characters of a driver name.
pub const MAX_DRIVER_LEN: usize = 63;
/// Characters of a label value.
const MAX_LABEL_VALUE_LEN: usize = 63;
/// Hex digits of the slice index in a slice name.
const INDEX_DIGITS: usize = 5;

/// Where counter sets live relative to the devices that consume them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Up to 1.34: counter sets and their devices in the same slice.
    Combined,
    /// 1.35 and later: counter sets in counter-only slices, devices in device-only slices.
    Split,
}

impl Layout {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Combined => "combined",
            Self::Split => "split",
        }
    }

    /// The most devices a slice may hold; `consuming`: any of them consumes counters.
    pub fn max_devices(self, consuming: bool) -> usize {
        match self {
            Self::Split if consuming => MAX_DEVICES_WITH_COUNTERS,
            _ => MAX_DEVICES,
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The layout an API server of this version accepts: Split from 1.35, Combined before.
pub fn layout_for(major: u32, minor: u32) -> Layout {
    if (major, minor) >= (1, 35) { Layout::Split } else { Layout::Combined }
}

/// One GPU's part of the pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSlices {
    /// Names the GPU in errors and orders nothing: GPUs are packed in the order given.
    pub minor: u32,
    /// The GPU's counter set (dynamic MIG); `None` when its devices consume no counters.
    pub counter_set: Option<(String, Counters)>,
    pub devices: Vec<Device>,
}

/// The node's GPUs cannot be published.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SliceError {
    #[error("GPU minor {minor} does not fit in one ResourceSlice ({layout} layout): {reason}")]
    GpuTooLarge { minor: u32, layout: Layout, reason: String },
    #[error("GPU minor {minor}: device {device} consumes counter set {set:?}, which is not this GPU's")]
    ForeignCounterSet { minor: u32, device: String, set: String },
}

/// What a group of GPUs puts into one slice, for the limits.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    devices: usize,
    /// Any device consumes counters or has taints: the 64-device cap applies (1.35+).
    consuming: bool,
    counter_sets: usize,
    /// Counters across the sets.
    set_counters: usize,
    /// Counters consumed, summed over the devices.
    consumed: usize,
}

impl Usage {
    fn of(gpu: &GpuSlices) -> Self {
        Self {
            devices: gpu.devices.len(),
            consuming: gpu.devices.iter().any(|d| d.consumes.is_some() || !d.taints.is_empty()),
            counter_sets: usize::from(gpu.counter_set.is_some()),
            set_counters: gpu.counter_set.as_ref().map_or(0, |(_, c)| c.len()),
            consumed: gpu.devices.iter().filter_map(|d| d.consumes.as_ref()).map(|(_, c)| c.len()).sum(),
        }
    }

    fn plus(self, o: Self) -> Self {
        Self {
            devices: self.devices + o.devices,
            consuming: self.consuming || o.consuming,
            counter_sets: self.counter_sets + o.counter_sets,
            set_counters: self.set_counters + o.set_counters,
            consumed: self.consumed + o.consumed,
        }
    }

    /// The first limit of a device slice (with its counter sets, in Combined) this exceeds.
    fn device_slice_excess(&self, layout: Layout) -> Option<String> {
        let max = layout.max_devices(self.consuming);
        if self.devices > max {
            let when = if layout == Layout::Split && self.consuming {
                " when devices consume counters or have taints"
            } else {
                ""
            };
            return Some(format!("{} devices, more than the {max} a slice may hold{when}", self.devices));
        }
        if layout == Layout::Combined {
            if self.set_counters > COMBINED_MAX_SHARED_COUNTERS {
                return Some(format!(
                    "{} counters in its counter sets, more than the {COMBINED_MAX_SHARED_COUNTERS} a slice may hold",
                    self.set_counters
                ));
            }
            if self.consumed > COMBINED_MAX_CONSUMED_COUNTERS {
                return Some(format!(
                    "its devices consume {} counters, more than the {COMBINED_MAX_CONSUMED_COUNTERS} a slice may list",
                    self.consumed
                ));
            }
        }
        None
    }
}

/// The label every slice of ours carries, so the publisher can list its own: `<driver>/node`.
pub fn node_label(driver: &str) -> String {
    format!("{driver}/node")
}

/// The value of [`node_label`] for a node: the node name, or, past the 63 characters a label
/// value may hold, its start and a hash of the whole name.
pub fn node_label_value(node: &str) -> String {
    if node.len() <= MAX_LABEL_VALUE_LEN {
        return node.to_string();
    }
    let hash = format!("{:08x}", fnv1a64(node.as_bytes()) as u32);
    let head = node[..MAX_LABEL_VALUE_LEN - hash.len() - 1].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}-{hash}")
}

/// The name of slice `index` of this node's pool: `<node>-<driver with '.' as '-'>-<5 hex digits>`.
/// Names of one pool sort in index order.
pub fn slice_name(node: &str, driver: &str, index: usize) -> String {
    let mut prefix = format!("{node}-{}", driver.replace('.', "-"));
    let room = MAX_SUBDOMAIN_LEN - INDEX_DIGITS - 1;
    if prefix.len() > room {
        let hash = format!("{:08x}", fnv1a64(prefix.as_bytes()) as u32);
        let head = prefix[..room - hash.len() - 1].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
        prefix = format!("{head}-{hash}");
    }
    format!("{prefix}-{index:0width$x}", width = INDEX_DIGITS)
}

/// A counter amount as a quantity: `memory` in MiB (`81152Mi`, like the `memory` capacity),
/// every other counter a plain count.
pub fn counter_quantity(name: &str, value: u64) -> Quantity {
    let q = if name == counters::MEMORY {
        crate::mig::devices::Quantity::MiB(value)
    } else {
        crate::mig::devices::Quantity::Count(value)
    };
    Quantity(q.to_string())
}

fn counter_map(c: &Counters) -> BTreeMap<String, api::Counter> {
    c.iter().map(|(k, &v)| (k.clone(), api::Counter { value: counter_quantity(k, v) })).collect()
}

fn attribute(v: &AttributeValue) -> api::DeviceAttribute {
    let mut a = api::DeviceAttribute::default();
    match v {
        AttributeValue::Int(i) => a.int = Some(*i),
        AttributeValue::Bool(b) => a.bool = Some(*b),
        AttributeValue::String(s) => a.string = Some(s.clone()),
        AttributeValue::Version(s) => a.version = Some(s.clone()),
    }
    a
}

/// One device of the model as the API's device. Bare attribute keys stay bare (the driver's
/// domain implicitly); qualified ones (`resource.kubernetes.io/pciBusID`) stay as they are.
pub fn device(d: &Device) -> api::Device {
    let attributes: BTreeMap<String, api::DeviceAttribute> =
        d.attributes.iter().map(|(k, v)| (k.clone(), attribute(v))).collect();
    let capacity: BTreeMap<String, api::DeviceCapacity> = d
        .capacity
        .iter()
        .map(|(k, q)| (k.clone(), api::DeviceCapacity { value: Quantity(q.to_string()), request_policy: None }))
        .collect();
    api::Device {
        name: d.name.clone(),
        attributes: (!attributes.is_empty()).then_some(attributes),
        capacity: (!capacity.is_empty()).then_some(capacity),
        consumes_counters: d.consumes.as_ref().map(|(set, c)| {
            vec![api::DeviceCounterConsumption {
                counter_set: set.clone(),
                counters: counter_map(c),
                ..Default::default()
            }]
        }),
        taints: (!d.taints.is_empty()).then(|| d.taints.iter().map(taints::taint).collect()),
        ..Default::default()
    }
}

/// A counter set as the API's.
pub fn counter_set(name: &str, c: &Counters) -> api::CounterSet {
    api::CounterSet { name: name.to_string(), counters: counter_map(c) }
}

/// What one slice holds, as indexes into the GPU list.
enum Content {
    /// The GPUs' devices; in Combined also their counter sets.
    Devices(Vec<usize>),
    /// Split only: the GPUs' counter sets.
    Counters(Vec<usize>),
}

fn check_gpu(gpu: &GpuSlices, layout: Layout) -> Result<(), SliceError> {
    let too_large = |reason: String| SliceError::GpuTooLarge { minor: gpu.minor, layout, reason };
    let own = gpu.counter_set.as_ref().map(|(n, _)| n.as_str());
    for d in &gpu.devices {
        if let Some((set, _)) = &d.consumes
            && Some(set.as_str()) != own
        {
            return Err(SliceError::ForeignCounterSet { minor: gpu.minor, device: d.name.clone(), set: set.clone() });
        }
    }
    if let Some((name, c)) = &gpu.counter_set
        && c.len() > MAX_COUNTERS_PER_SET
    {
        return Err(too_large(format!(
            "counter set {name} has {} counters, more than {MAX_COUNTERS_PER_SET}",
            c.len()
        )));
    }
    match Usage::of(gpu).device_slice_excess(layout) {
        Some(reason) => Err(too_large(reason)),
        None => Ok(()),
    }
}

/// Which GPUs go into which slice, in slice order.
fn plan(layout: Layout, gpus: &[GpuSlices]) -> Result<Vec<Content>, SliceError> {
    let mut bins: Vec<(Content, Usage)> = Vec::new();
    // The open device slice for GPUs whose devices consume counters, and the one for the others.
    let mut open: [Option<usize>; 2] = [None, None];
    for (i, gpu) in gpus.iter().enumerate() {
        check_gpu(gpu, layout)?;
        let usage = Usage::of(gpu);
        let in_device_slice = usage.devices > 0 || (layout == Layout::Combined && usage.counter_sets > 0);
        if !in_device_slice {
            continue;
        }
        let group = usize::from(usage.consuming || usage.counter_sets > 0);
        let joined = open[group].filter(|&b| bins[b].1.plus(usage).device_slice_excess(layout).is_none());
        match joined {
            Some(b) => {
                if let (Content::Devices(members), u) = &mut bins[b] {
                    members.push(i);
                    *u = u.plus(usage);
                }
            }
            None => {
                open[group] = Some(bins.len());
                bins.push((Content::Devices(vec![i]), usage));
            }
        }
    }
    let mut plan: Vec<Content> = bins.into_iter().map(|(c, _)| c).collect();
    if layout == Layout::Split {
        let with_sets: Vec<usize> =
            gpus.iter().enumerate().filter(|(_, g)| g.counter_set.is_some()).map(|(i, _)| i).collect();
        plan.extend(with_sets.chunks(MAX_COUNTER_SETS).map(|c| Content::Counters(c.to_vec())));
    }
    Ok(plan)
}

/// Every ResourceSlice of this node's pool (pool name = node name), in priority order.
///
/// `node_uid` adds an owner reference to the Node, so the slices go when the node goes.
/// `resourceSliceCount` counts every slice, counter-only ones included. Slices that hold no
/// devices send `devices: None` and slices without counter sets `sharedCounters: None`: the API
/// server tells them apart by nil-ness, and k8s-openapi omits `None`.
///
/// # Errors
/// A GPU does not fit in one slice, or a device consumes a counter set its GPU does not define.
pub fn build(
    driver: &str,
    node: &str,
    node_uid: Option<&str>,
    generation: i64,
    layout: Layout,
    gpus: &[GpuSlices],
) -> Result<Vec<ResourceSlice>, SliceError> {
    let plan = plan(layout, gpus)?;
    let count = plan.len() as i64;
    let sets = |members: &[usize]| -> Vec<api::CounterSet> {
        members.iter().filter_map(|&i| gpus[i].counter_set.as_ref()).map(|(n, c)| counter_set(n, c)).collect()
    };
    let owner = node_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.to_string(),
            uid: uid.to_string(),
            controller: Some(true),
            block_owner_deletion: None,
        }]
    });
    let slices = plan
        .iter()
        .enumerate()
        .map(|(index, content)| {
            let (devices, shared_counters) = match content {
                Content::Devices(members) => {
                    let devices: Vec<api::Device> =
                        members.iter().flat_map(|&i| gpus[i].devices.iter().map(device)).collect();
                    let shared = if layout == Layout::Combined { sets(members) } else { Vec::new() };
                    ((!devices.is_empty()).then_some(devices), (!shared.is_empty()).then_some(shared))
                }
                Content::Counters(members) => (None, Some(sets(members))),
            };
            ResourceSlice {
                metadata: ObjectMeta {
                    name: Some(slice_name(node, driver, index)),
                    labels: Some(BTreeMap::from([(node_label(driver), node_label_value(node))])),
                    owner_references: owner.clone(),
                    ..Default::default()
                },
                spec: api::ResourceSliceSpec {
                    driver: driver.to_string(),
                    node_name: Some(node.to_string()),
                    pool: api::ResourcePool { name: node.to_string(), generation, resource_slice_count: count },
                    devices,
                    shared_counters,
                    ..Default::default()
                },
            }
        })
        .collect();
    Ok(slices)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::mig::catalog::{GpuModel, model};
    use crate::mig::devices::{self, GpuIdentity, GpuMode, gpu_devices};
    use crate::names::{is_dns_label, is_dns_subdomain};

    pub(super) const DRIVER: &str = "mig.slinky.slurm.net";
    pub(super) const NODE: &str = "node-a";

    /// A GPU as NVML would report it, its Slurm index its NVML index.
    pub(crate) fn identity(m: &GpuModel, index: u32, minor: u32, uuid: String) -> GpuIdentity {
        GpuIdentity {
            index,
            minor,
            uuid,
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x18 + index),
            product_name: m.product_name.clone(),
            memory_mib: m.memory_mib,
            driver_version: "580.95.05".into(),
            cuda_compute_capability: m.cuda_compute_capability,
            slurm_index: Some(index),
            slurm_index_source: "nvml".into(),
            shards_per_gpu: m.memory_slices,
            topology: Default::default(),
        }
    }

    pub(super) fn gpu(key: &str, index: u32, mode: GpuMode) -> GpuSlices {
        let m: &GpuModel = model(key).unwrap();
        let minor = index + 100;
        let id = identity(m, index, minor, format!("GPU-00000000-0000-0000-0000-{index:012}"));
        let counter_set = (mode == GpuMode::Dynamic)
            .then(|| (counters::counter_set_name(minor), counters::CounterSet::for_model(m).capacity().clone()));
        GpuSlices {
            minor,
            counter_set,
            devices: gpu_devices(
                m,
                &id,
                mode,
                true,
                &[],
                crate::mig::naming::NameStyle::Minor,
                &crate::mig::allowlist::Allowlist::all(),
            ),
        }
    }

    pub(super) fn node(spec: &[(&str, u32, GpuMode)]) -> Vec<GpuSlices> {
        let mut out = Vec::new();
        for &(key, n, mode) in spec {
            for _ in 0..n {
                out.push(gpu(key, out.len() as u32, mode));
            }
        }
        out
    }

    /// [`node`] with every resource counted, as migdra published before its sets were made
    /// minimal: wide sets that still test the per-slice counter limits.
    pub(super) fn node_wide(spec: &[(&str, u32, GpuMode)]) -> Vec<GpuSlices> {
        let mut gpus = node(spec);
        for (g, m) in gpus.iter_mut().zip(spec.iter().flat_map(|&(key, n, _)| (0..n).map(move |_| key))) {
            let m = model(m).unwrap();
            let every = counters::CounterSet::every_resource(m);
            if let Some((_, c)) = &mut g.counter_set {
                *c = every.capacity().clone();
            }
            for d in &mut g.devices {
                let Some((_, c)) = &mut d.consumes else { continue };
                let int = |k: &str| match d.attributes.get(k) {
                    Some(devices::AttributeValue::Int(v)) => Some(*v as u32),
                    _ => None,
                };
                *c = match (int("profileId"), int("placementStart")) {
                    (Some(id), Some(start)) => every.mig(m.profile(id).unwrap(), start),
                    _ => every.whole_gpu(),
                };
            }
        }
        gpus
    }

    /// `gpu-<minor>` of a device name.
    pub(super) fn parent(device: &str) -> &str {
        device.split_once("-mig-").map_or(device, |(p, _)| p)
    }

    pub(super) fn names(slices: &[ResourceSlice]) -> Vec<String> {
        slices.iter().map(|s| s.metadata.name.clone().unwrap()).collect()
    }

    pub(super) fn device_counts(slices: &[ResourceSlice]) -> Vec<usize> {
        slices.iter().map(|s| s.spec.devices.as_ref().map_or(0, Vec::len)).collect()
    }

    pub(super) fn set_counts(slices: &[ResourceSlice]) -> Vec<usize> {
        slices.iter().map(|s| s.spec.shared_counters.as_ref().map_or(0, Vec::len)).collect()
    }

    #[test]
    fn layout_follows_the_server_version() {
        assert_eq!(layout_for(1, 33), Layout::Combined);
        assert_eq!(layout_for(1, 34), Layout::Combined);
        assert_eq!(layout_for(1, 35), Layout::Split);
        assert_eq!(layout_for(1, 37), Layout::Split);
        assert_eq!(layout_for(2, 0), Layout::Split);
    }

    #[test]
    #[allow(clippy::print_stdout)] // prints the slice counts per layout
    fn sixteen_h100s_validate_clean_in_both_layouts() {
        let published = node(&[("h100-80gb", 16, GpuMode::Dynamic)]);
        let wide = node_wide(&[("h100-80gb", 16, GpuMode::Dynamic)]);
        let per_gpu = published[0].devices.len();
        for (layout, gpus) in [
            (Layout::Combined, &published),
            (Layout::Combined, &wide),
            (Layout::Split, &published),
            (Layout::Split, &wide),
        ] {
            let gpus = gpus.as_slice();
            let set_len = gpus[0].counter_set.as_ref().unwrap().1.len();
            let slices = build(DRIVER, NODE, Some("uid-1"), 3, layout, gpus).unwrap();
            assert_eq!(validate(&slices, layout), Vec::<String>::new(), "{layout}");
            let devices: usize = device_counts(&slices).iter().sum();
            assert_eq!(devices, 16 * per_gpu);
            let consumed: Vec<usize> = slices
                .iter()
                .map(|s| {
                    s.spec
                        .devices
                        .iter()
                        .flatten()
                        .flat_map(|d| d.consumes_counters.iter().flatten())
                        .map(|c| c.counters.len())
                        .sum()
                })
                .collect();
            println!(
                "16 × H100 {layout}, {set_len} counters per set: {} slices ({} with devices, {} counter-only), \
                 devices per slice {:?}, sets per slice {:?}, counters consumed per slice {:?}",
                slices.len(),
                slices.iter().filter(|s| s.spec.devices.is_some()).count(),
                slices.iter().filter(|s| s.spec.devices.is_none()).count(),
                device_counts(&slices),
                set_counts(&slices),
                consumed
            );
            for s in &slices {
                assert_eq!(s.spec.pool.resource_slice_count, slices.len() as i64);
                assert_eq!(s.spec.pool.generation, 3);
                assert_eq!(s.spec.node_name.as_deref(), Some(NODE));
                let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
                assert_eq!(
                    (owner.api_version.as_str(), owner.kind.as_str(), owner.uid.as_str()),
                    ("v1", "Node", "uid-1")
                );
                assert_eq!(s.metadata.labels.as_ref().unwrap()[&node_label(DRIVER)], NODE);
            }
            match layout {
                // 15 counters per H100 set, every resource: two sets per slice (30 ≤ 32).
                Layout::Combined if set_len == 15 => {
                    assert_eq!(slices.len(), 8);
                    assert!(set_counts(&slices).iter().all(|&n| n == 2));
                }
                // 8 counters per published set: four GPUs per slice (104 devices ≤ 128, 32 counters).
                Layout::Combined => {
                    assert_eq!(set_len, 8);
                    assert_eq!(slices.len(), 4);
                    assert!(set_counts(&slices).iter().all(|&n| n == 4));
                }
                // 26 devices per H100: two GPUs per device slice (≤ 64); 8 sets per counter slice.
                Layout::Split => {
                    assert_eq!(slices.len(), 8 + 2);
                    assert_eq!(set_counts(&slices)[8..], [8, 8]);
                    assert!(slices[..8].iter().all(|s| s.spec.shared_counters.is_none()));
                    assert!(slices[8..].iter().all(|s| s.spec.devices.is_none()));
                }
            }
        }
    }

    #[test]
    fn rtx_pro_sets_of_19_counters_take_a_combined_slice_each() {
        let gpus = node_wide(&[("rtx-pro-6000", 3, GpuMode::Dynamic)]);
        assert_eq!(gpus[0].counter_set.as_ref().unwrap().1.len(), 19);
        let slices = build(DRIVER, NODE, None, 1, Layout::Combined, &gpus).unwrap();
        assert_eq!(validate(&slices, Layout::Combined), Vec::<String>::new());
        assert_eq!(slices.len(), 3);
        for (s, g) in slices.iter().zip(&gpus) {
            let sets = s.spec.shared_counters.as_ref().unwrap();
            assert_eq!(sets.len(), 1);
            assert_eq!(sets[0].name, g.counter_set.as_ref().unwrap().0);
            assert_eq!(s.spec.devices.as_ref().unwrap().len(), g.devices.len());
            assert!(s.metadata.owner_references.is_none());
        }
        let split = build(DRIVER, NODE, None, 1, Layout::Split, &gpus).unwrap();
        assert_eq!(validate(&split, Layout::Split), Vec::<String>::new());
    }

    #[test]
    fn mig_off_gpus_get_their_own_device_slice() {
        let gpus = node(&[("h100-80gb", 2, GpuMode::Dynamic), ("a100-40gb", 1, GpuMode::Full)]);
        for layout in [Layout::Combined, Layout::Split] {
            let slices = build(DRIVER, NODE, None, 1, layout, &gpus).unwrap();
            assert_eq!(validate(&slices, layout), Vec::<String>::new(), "{layout}");
            let full = &slices[1];
            assert_eq!(device_counts(&slices)[..2], [2 * gpus[0].devices.len(), 1]);
            assert!(full.spec.shared_counters.is_none());
            let d = &full.spec.devices.as_ref().unwrap()[0];
            assert_eq!(d.name, "gpu-102");
            assert!(d.consumes_counters.is_none());
            assert_eq!(slices.len(), if layout == Layout::Split { 3 } else { 2 });
        }
    }

    #[test]
    fn static_and_full_gpus_pack_up_to_128_devices() {
        let gpus = node(&[("a100-40gb", 130, GpuMode::Full)]);
        let slices = build(DRIVER, NODE, None, 1, Layout::Split, &gpus).unwrap();
        assert_eq!(device_counts(&slices), [128, 2]);
        assert_eq!(validate(&slices, Layout::Split), Vec::<String>::new());
    }

    pub(super) fn tainted(gpus: &mut [GpuSlices], i: usize) {
        use crate::mig::taints::{Cause, Effect, GpuHealth, TaintPolicy, apply};
        let sick = GpuHealth { gpu: Some(Cause::Xid(79)), instances: vec![] };
        apply(&mut gpus[i].devices, &sick, DRIVER, TaintPolicy::Taint(Effect::NoSchedule));
    }

    /// A tainted GPU's devices go where the 64-device cap of 1.35 holds (beside counter-consuming
    /// devices); untainted whole GPUs keep packing 128 to a slice.
    #[test]
    fn a_tainted_gpu_packs_under_the_64_device_cap() {
        let mut gpus = node(&[("a100-40gb", 130, GpuMode::Full)]);
        for i in 0..65 {
            tainted(&mut gpus, i);
        }
        let slices = build(DRIVER, NODE, None, 1, Layout::Split, &gpus).unwrap();
        assert_eq!(device_counts(&slices), [64, 1, 65]);
        assert_eq!(validate(&slices, Layout::Split), Vec::<String>::new());
        let d = &slices[0].spec.devices.as_ref().unwrap()[0];
        let t = &d.taints.as_ref().unwrap()[0];
        assert_eq!(
            (t.key.as_str(), t.value.as_deref(), t.effect.as_str()),
            ("mig.slinky.slurm.net/xid", Some("79"), "NoSchedule")
        );
        assert_eq!(t.time_added, None, "the publisher, not the builder, sets the time");
    }

    #[test]
    fn names_sort_in_priority_order() {
        // 16 RTX PRO in Combined: one slice each, indexes 0..f.
        let gpus = node_wide(&[("rtx-pro-6000", 16, GpuMode::Dynamic)]);
        let slices = build(DRIVER, NODE, None, 1, Layout::Combined, &gpus).unwrap();
        let n = names(&slices);
        assert_eq!(n.len(), 16);
        assert_eq!(n[10], "node-a-mig-slinky-slurm-net-0000a");
        let mut sorted = n.clone();
        sorted.sort();
        assert_eq!(sorted, n);
        // The slice order is the GPU order: slice k holds GPU k's devices.
        for (k, s) in slices.iter().enumerate() {
            assert!(s.spec.devices.as_ref().unwrap().iter().all(|d| parent(&d.name) == format!("gpu-{}", 100 + k)));
        }
        // Split: device slices, in GPU order, before the counter slices.
        let gpus = node(&[
            ("h100-80gb", 3, GpuMode::Dynamic),
            ("a100-40gb", 1, GpuMode::Full),
            ("h100-80gb", 2, GpuMode::Dynamic),
        ]);
        let slices = build(DRIVER, NODE, None, 1, Layout::Split, &gpus).unwrap();
        let n = names(&slices);
        let mut sorted = n.clone();
        sorted.sort();
        assert_eq!(sorted, n);
        let kinds: Vec<bool> = slices.iter().map(|s| s.spec.devices.is_some()).collect();
        assert_eq!(kinds, [true, true, true, true, false]);
        // GPUs 0+1; GPU 2, which GPU 4 joins (the MIG-off GPU 3 has a slice of its own); GPU 3;
        // GPU 5. Each slice sorts by its first GPU.
        let gpus_of = |s: &ResourceSlice| -> Vec<String> {
            let mut g: Vec<String> =
                s.spec.devices.as_ref().unwrap().iter().map(|d| parent(&d.name).to_string()).collect();
            g.dedup();
            g
        };
        let covered: Vec<Vec<String>> = slices[..4].iter().map(gpus_of).collect();
        assert_eq!(covered, [vec!["gpu-100", "gpu-101"], vec!["gpu-102", "gpu-104"], vec!["gpu-103"], vec!["gpu-105"]]);
        assert_eq!(validate(&slices, Layout::Split), Vec::<String>::new());
    }

    #[test]
    fn long_names_stay_valid_and_distinct() {
        let node = format!("{}.example.com", "n".repeat(240));
        let a = slice_name(&node, DRIVER, 1);
        let b = slice_name(&format!("{}.example.org", "n".repeat(240)), DRIVER, 1);
        assert!(a.len() <= MAX_SUBDOMAIN_LEN && is_dns_subdomain(&a), "{a}");
        assert_ne!(a, b);
        assert!(a.ends_with("-00001"));
        let v = node_label_value(&node);
        assert!(v.len() <= 63 && is_dns_label(&v.replace('.', "-")), "{v}");
        assert_ne!(v, node_label_value(&format!("{}.example.org", "n".repeat(240))));
        assert_eq!(node_label_value("node-a"), "node-a");
    }

    #[test]
    fn a_gpu_that_alone_breaks_a_limit_is_named() {
        let mut g = gpu("h100-80gb", 0, GpuMode::Dynamic);
        let extra: Vec<Device> =
            (0..40).map(|i| Device { name: format!("gpu-100-extra-{i}"), ..g.devices[1].clone() }).collect();
        g.devices.extend(extra);
        let e = build(DRIVER, NODE, None, 1, Layout::Split, &[g.clone()]).unwrap_err();
        assert!(matches!(e, SliceError::GpuTooLarge { minor: 100, .. }), "{e}");
        assert!(e.to_string().contains("66 devices, more than the 64"), "{e}");
        assert!(build(DRIVER, NODE, None, 1, Layout::Combined, &[g]).is_ok(), "128 devices in Combined");

        let mut foreign = gpu("h100-80gb", 0, GpuMode::Dynamic);
        foreign.devices[3].consumes.as_mut().unwrap().0 = "gpu-7-counters".into();
        let e = build(DRIVER, NODE, None, 1, Layout::Split, &[foreign]).unwrap_err();
        assert!(matches!(e, SliceError::ForeignCounterSet { minor: 100, .. }), "{e}");
    }

    #[test]
    fn json_round_trip_keeps_every_counter_field() {
        let gpus = node_wide(&[("h100-80gb", 2, GpuMode::Dynamic)]);
        for layout in [Layout::Combined, Layout::Split] {
            let slices = build(DRIVER, NODE, Some("uid-1"), 7, layout, &gpus).unwrap();
            let text = serde_json::to_string(&slices).unwrap();
            let back: Vec<ResourceSlice> = serde_json::from_str(&text).unwrap();
            assert_eq!(back, slices, "{layout}");
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            for s in value.as_array().unwrap() {
                assert_eq!(s["apiVersion"], "resource.k8s.io/v1");
                assert_eq!(s["kind"], "ResourceSlice");
                let spec = &s["spec"];
                if layout == Layout::Split {
                    assert!(spec.get("devices").is_none() || spec.get("sharedCounters").is_none(), "{spec}");
                }
            }
            // Every counter of every set and of every consumption, with its quantity.
            let sets: Vec<&api::CounterSet> =
                back.iter().flat_map(|s| s.spec.shared_counters.iter().flatten()).collect();
            assert_eq!(sets.len(), 2);
            for (g, set) in gpus.iter().zip(&sets) {
                let (name, c) = g.counter_set.as_ref().unwrap();
                assert_eq!(&set.name, name);
                assert_eq!(set.counters, counter_map(c));
            }
            assert_eq!(sets[0].counters["memory"].value.0, "81152Mi");
            assert_eq!(sets[0].counters["memory-slice-7"].value.0, "1");
            let devices: Vec<&api::Device> = back.iter().flat_map(|s| s.spec.devices.iter().flatten()).collect();
            let model: Vec<&Device> = gpus.iter().flat_map(|g| &g.devices).collect();
            assert_eq!(devices.len(), model.len());
            for (d, m) in devices.iter().zip(&model) {
                assert_eq!(d.name, m.name);
                let (set, c) = m.consumes.as_ref().unwrap();
                let got = &d.consumes_counters.as_ref().unwrap()[0];
                assert_eq!((&got.counter_set, &got.counters), (set, &counter_map(c)));
                assert_eq!(d.attributes.as_ref().unwrap().len(), m.attributes.len());
                assert_eq!(d.capacity.as_ref().unwrap()["memory"].value.0, m.capacity["memory"].to_string());
            }
            let three_g = devices.iter().find(|d| d.name == "gpu-100-mig-3g40gb-9-4").unwrap();
            let attrs = three_g.attributes.as_ref().unwrap();
            assert_eq!(attrs["profileId"].int, Some(9));
            assert_eq!(attrs["driverVersion"].version.as_deref(), Some("580.95.5"));
            assert_eq!(attrs[devices::PCI_BUS_ID].string.as_deref(), Some("0000:18:00.0"));
            assert_eq!(three_g.consumes_counters.as_ref().unwrap()[0].counters["memory"].value.0, "40192Mi");
        }
    }
}
