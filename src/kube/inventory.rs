//! The node's GPUs as the slice builder takes them: every GPU the engine drives, its devices
//! (with the UUIDs of the instances that exist now) and its counter set. `migdra slices` and the
//! publisher both start here, so the dry run prints exactly what would be published.

use super::slices::GpuSlices;
use crate::gpu::{GpuBackend, GpuError};
use crate::mig::allowlist::Allowlist;
use crate::mig::counters;
use crate::mig::devices::{ExistingInstance, GpuIdentity, GpuMode, dynamic_counters, gpu_devices};
use crate::mig::naming::{DeviceName, NameStyle};
use crate::mig::taints::{self, TaintPolicy};
use crate::packing::policy::{self, DeviceOrder};
use crate::prepare::{Engine, GpuEntry};
use std::collections::BTreeSet;

/// What the device model needs to know about an engine's GPU.
pub fn identity(gpu: &GpuEntry) -> GpuIdentity {
    gpu.identity()
}

/// The MIG instances on a GPU that have a compute instance, so a MIG UUID; a GPU instance without
/// one cannot be handed to a workload as it is, so it is not an existing device.
///
/// # Errors
/// NVML fails to list instances.
pub fn existing_instances(backend: &dyn GpuBackend, gpu: &GpuEntry) -> Result<Vec<ExistingInstance>, GpuError> {
    if !gpu.info.mig_enabled {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    let mut gis = backend.gpu_instances(&gpu.info.uuid)?;
    gis.sort_by_key(|g| g.start);
    for gi in gis {
        if let Some(ci) = backend.compute_instances(&gpu.info.uuid, gi.id)?.into_iter().next() {
            let slurm_index = gpu.slurm.mig_index(gi.id, ci.id);
            out.push(ExistingInstance { profile_id: gi.profile_id, start: gi.start, uuid: ci.uuid, slurm_index });
        }
    }
    Ok(out)
}

/// How the node's GPUs are published: the device order, and the taints for unhealthy GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishOptions {
    pub order: DeviceOrder,
    pub taints: TaintPolicy,
}

/// One GPU's slice input: dynamic MIG GPUs carry their counter set and devices that consume it,
/// in the device `order` (the scheduler takes the first that fits, so the order picks the
/// placement); static MIG and MIG-off GPUs have devices only. `names` and `profiles`: see
/// [`gpu_devices`].
pub fn gpu_slices(
    gpu: &GpuEntry,
    existing: &[ExistingInstance],
    whole_gpu: bool,
    order: DeviceOrder,
    names: NameStyle,
    profiles: &Allowlist,
) -> GpuSlices {
    let minor = gpu.info.minor;
    let counter_set = (gpu.mode == GpuMode::Dynamic).then(|| {
        (counters::counter_set_name(minor), dynamic_counters(&gpu.model, existing, profiles).capacity().clone())
    });
    let mut devices = gpu_devices(&gpu.model, &identity(gpu), gpu.mode, whole_gpu, existing, names, profiles);
    if gpu.mode == GpuMode::Dynamic {
        policy::order_devices(&gpu.model, &mut devices, order.static_policy());
    }
    GpuSlices { minor, counter_set, devices }
}

/// Every GPU of the engine, in NVML index order, each GPU's devices in the default order and
/// unhealthy GPUs tainted `NoSchedule`. `whole_gpu`: also offer MIG-enabled GPUs whole (only
/// where the operator lets migdra change the MIG mode; Hopper and newer).
///
/// # Errors
/// NVML fails to list the GPUs or a GPU's instances.
pub fn node_gpus(engine: &Engine, whole_gpu: bool) -> Result<Vec<GpuSlices>, GpuError> {
    node_gpus_with(engine, whole_gpu, PublishOptions::default())
}

/// [`node_gpus`] with each GPU's devices in `opts.order`, named as the engine's options say, and
/// tainted as `opts.taints` says.
///
/// # Errors
/// NVML fails to list the GPUs or a GPU's instances.
pub fn node_gpus_with(engine: &Engine, whole_gpu: bool, opts: PublishOptions) -> Result<Vec<GpuSlices>, GpuError> {
    node_gpus_holding(engine, whole_gpu, opts, &BTreeSet::new())
}

/// The profiles of a GPU's devices that claims hold (`held`: device names of this node's
/// pool), by name: they stay published whatever `--profiles` says.
fn held_profiles(gpu: &GpuEntry, held: &BTreeSet<String>) -> Vec<String> {
    held.iter()
        .filter_map(|name| match DeviceName::parse(name) {
            Ok(DeviceName::Mig { parent_minor, profile_id, .. }) if parent_minor == gpu.info.minor => {
                gpu.model.profile(profile_id).map(|p| p.name.clone())
            }
            _ => None,
        })
        .collect()
}

/// [`node_gpus_with`], keeping published every device in `held` (the devices of this node's pool
/// that claims hold): a profile `--profiles` leaves out stays published on a GPU while a claim
/// holds a device of it, so an operator's new allowlist never drops an allocated device
/// (kubernetes#140802); its instance, once prepared, keeps it published as well.
///
/// # Errors
/// NVML fails to list the GPUs or a GPU's instances.
pub fn node_gpus_holding(
    engine: &Engine,
    whole_gpu: bool,
    opts: PublishOptions,
    held: &BTreeSet<String>,
) -> Result<Vec<GpuSlices>, GpuError> {
    let backend = engine.backend();
    let health = match opts.taints {
        TaintPolicy::Off => Vec::new(),
        TaintPolicy::Taint(_) => crate::prepare::node_health(engine)?,
    };
    let (order, policy) = (opts.order, opts.taints);
    engine
        .gpus()
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let existing = match existing_instances(backend.as_ref(), g) {
                Ok(existing) => existing,
                // Lost since start: keep the other GPUs published; health marks this one's devices.
                Err(e) if e.code() == Some(crate::gpu::NvmlCode::GpuIsLost) => {
                    tracing::warn!(gpu = %g.info.uuid, "GPU is lost; publishing its devices without instances: {e}");
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            let opts = engine.options();
            let profiles = opts.profiles.including(&held_profiles(g, held));
            let mut gpu = gpu_slices(g, &existing, whole_gpu, order, opts.device_names, &profiles);
            if let Some(h) = health.get(i) {
                taints::apply(&mut gpu.devices, h, &opts.driver, policy);
            }
            Ok(gpu)
        })
        .collect()
}
