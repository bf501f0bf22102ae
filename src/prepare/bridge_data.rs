//! What migdra reports per prepared device in the ResourceClaim status (`status.devices[].data`),
//! so slurm-bridge can reserve the matching capacity in Slurm.

use crate::mig::devices::shards_for;
use crate::slurm::{GpuSlurm, Source};
use crate::state::{DeviceRecord, MigRecord};
use serde::{Deserialize, Serialize};

/// `status.devices[].data` of one device. MIG fields are absent for a whole GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatusData {
    #[serde(rename = "migUUID", skip_serializing_if = "Option::is_none")]
    pub mig_uuid: Option<String>,
    #[serde(rename = "parentUUID")]
    pub parent_uuid: String,
    #[serde(rename = "parentPCIBusID")]
    pub parent_pci_bus_id: String,
    pub parent_minor: u32,
    /// The parent GPU's index in Slurm's GRES list; absent when Slurm lists only its MIG instances.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_gpu_index: Option<u32>,
    /// What decided `slurmGpuIndex`: `admin-map`, `slurmd`, `gres.conf` or `nvml`.
    pub slurm_gpu_index_source: Source,
    /// The MIG instance's own index, when Slurm lists it as a GPU (static MIG).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_mig_index: Option<u32>,
    pub slurm_shards: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compute_instance_id: Option<u32>,
    /// A device prepared for admin access (monitoring): it holds nothing, so `slurmShards` is 0
    /// and there are no MIG fields; the bridge reserves nothing for it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub start: u32,
    pub size: u32,
}

/// Status data of a prepared device.
pub fn status_data(d: &DeviceRecord, slurm: &GpuSlurm) -> DeviceStatusData {
    let shards = |m: &MigRecord| shards_for(m.size, slurm.memory_slices, slurm.shards);
    DeviceStatusData {
        mig_uuid: d.mig.as_ref().and_then(|m| m.uuid.clone()),
        parent_uuid: d.gpu_uuid.clone(),
        parent_pci_bus_id: crate::pci::standard(&d.pci_bus_id),
        parent_minor: d.gpu_minor,
        slurm_gpu_index: slurm.index,
        slurm_gpu_index_source: slurm.source,
        slurm_mig_index: d.mig.as_ref().and_then(|m| slurm.mig_index(m.gi_id?, m.ci_id?)),
        slurm_shards: d.mig.as_ref().map_or(slurm.shards, shards),
        profile: d.mig.as_ref().map(|m| m.profile.clone()),
        profile_id: d.mig.as_ref().map(|m| m.profile_id),
        placement: d.mig.as_ref().map(|m| Placement { start: m.start, size: m.size }),
        gpu_instance_id: d.mig.as_ref().and_then(|m| m.gi_id),
        compute_instance_id: d.mig.as_ref().and_then(|m| m.ci_id),
        admin_access: false,
    }
}

/// Status data of a device prepared for admin access: the parent GPU, no shards.
pub fn admin_status_data(d: &DeviceRecord, slurm: &GpuSlurm) -> DeviceStatusData {
    let whole = DeviceRecord { mig: None, ..d.clone() };
    DeviceStatusData { slurm_shards: 0, admin_access: true, ..status_data(&whole, slurm) }
}
