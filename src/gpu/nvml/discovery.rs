//! What one GPU is, from NVML: its identity (nvml-wrapper's safe calls) and its MIG model
//! (profile info and placements, raw calls), matched against the catalog.
//!
//! NVML's own answers are the truth on a real GPU. When they describe exactly the partitions a
//! catalog model has, the catalog model is used (it also knows profile names, compute instance
//! profiles and media engines); otherwise the model is built from NVML's answers alone, so a GPU
//! or driver the catalog does not know still works.

use super::codes::{from_raw, from_wrapper};
use super::ffi;
use crate::gpu::{GpuError, NvmlCode, Result};
use crate::mig::catalog::{self, Evidence, GpuModel};
use crate::mig::discovered::{NvmlDescription, architecture, describe_from_nvml, model_key};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};

/// Profile indexes asked for: `NVML_GPU_INSTANCE_PROFILE_COUNT` is 17 in nvml-wrapper-sys and 18
/// in the v13 header (docs/facts/mig-nvml.md §3); the rest leaves room for newer drivers.
pub const PROFILE_INDEXES: u32 = 24;

/// MIG mode as NVML reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigState {
    Enabled,
    /// MIG-capable, mode off.
    Disabled,
    /// GetMigMode says NOT_SUPPORTED.
    NotCapable,
}

/// One GPU's identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub index: u32,
    pub minor: u32,
    pub uuid: String,
    /// `00000000:18:00.0`.
    pub pci_bus_id: String,
    /// The high 16 bits of `pciDeviceId`.
    pub pci_device_id: u16,
    pub name: String,
    pub memory_mib: u64,
    pub mig: MigState,
    pub cuda_compute_capability: (u32, u32),
}

/// Read a GPU's identity. Errors name the GPU by index until its UUID is known.
pub fn identity(dev: &Device, index: u32) -> Result<Identity> {
    let at = index.to_string();
    let uuid = dev.uuid().map_err(|e| from_wrapper("nvmlDeviceGetUUID", &at, e))?;
    let fail = |op: &'static str| {
        let uuid = uuid.clone();
        move |e: NvmlError| from_wrapper(op, &uuid, e)
    };
    let minor = dev.minor_number().map_err(fail("nvmlDeviceGetMinorNumber"))?;
    let pci = dev.pci_info().map_err(fail("nvmlDeviceGetPciInfo_v3"))?;
    let name = dev.name().map_err(fail("nvmlDeviceGetName"))?;
    let memory = dev.memory_info().map_err(fail("nvmlDeviceGetMemoryInfo_v2"))?;
    let mig = match dev.mig_mode() {
        Ok(m) if m.current == 1 => MigState::Enabled,
        Ok(_) => MigState::Disabled,
        Err(NvmlError::NotSupported) => MigState::NotCapable,
        Err(e) => return Err(fail("nvmlDeviceGetMigMode")(e)),
    };
    let cc = dev.cuda_compute_capability().map_err(fail("nvmlDeviceGetCudaComputeCapability"))?;
    Ok(Identity {
        index,
        minor,
        uuid: uuid.clone(),
        pci_bus_id: pci.bus_id,
        pci_device_id: (pci.pci_device_id >> 16) as u16,
        name,
        memory_mib: memory.total / (1024 * 1024),
        mig,
        cuda_compute_capability: (cc.major.max(0) as u32, cc.minor.max(0) as u32),
    })
}

/// The model of a GPU: NVML's description when MIG is on (the catalog's when it agrees), the
/// catalog's or a whole-GPU-only model otherwise.
pub fn model(nvml: &Nvml, dev: &Device, id: &Identity) -> Result<GpuModel> {
    let known = catalog_model(id);
    if id.mig != MigState::Enabled {
        return Ok(known.cloned().unwrap_or_else(|| whole_gpu_model(id)));
    }
    let described = describe_from_nvml(&describe(nvml, dev, id)?)
        .map_err(|e| GpuError::Unsupported(format!("GPU {} has MIG on, but {e}", id.uuid)))?;
    match known {
        Some(c) if same_partitions(c, &described) => {
            // Profile memory moves by a few hundred MiB between drivers; the catalog holds one's.
            for p in &c.profiles {
                let nvml = described.profile(p.id).map_or(p.memory_mib, |d| d.memory_mib);
                if nvml != p.memory_mib {
                    tracing::info!(
                        gpu = %id.uuid,
                        profile = %p.name,
                        catalog_mib = p.memory_mib,
                        nvml_mib = nvml,
                        "profile memory differs from the catalog's; publishing the catalog's"
                    );
                }
            }
            Ok(c.clone())
        }
        Some(c) => {
            tracing::warn!(
                gpu = %id.uuid,
                catalog = %c.key,
                "NVML's MIG profiles differ from the catalog's; using NVML's"
            );
            Ok(described)
        }
        None => Ok(described),
    }
}

/// The catalog's model of a GPU: by PCI device ID, else by NVML name.
pub fn catalog_model(id: &Identity) -> Option<&'static GpuModel> {
    catalog::model_by_pci_device_id(id.pci_device_id).or_else(|| catalog::model_by_nvml_name(&id.name))
}

/// The model NVML's own answers describe, whatever the MIG mode: the profile queries answer
/// with MIG off on drivers that support it, which lets an operator check the catalog against a
/// GPU before turning MIG on. Read-only.
pub fn observe(nvml: &Nvml, dev: &Device, id: &Identity) -> Result<GpuModel> {
    describe_from_nvml(&describe(nvml, dev, id)?)
        .map_err(|e| GpuError::Unsupported(format!("GPU {} (MIG {:?}): {e}", id.uuid, id.mig)))
}

/// Every GPU instance profile NVML answers for, with its placements.
fn describe(nvml: &Nvml, dev: &Device, id: &Identity) -> Result<NvmlDescription> {
    let mut profiles = Vec::new();
    for index in 0..PROFILE_INDEXES {
        let mut profile = match ffi::gi_profile_info(nvml, dev, index) {
            Ok(profile) => profile,
            Err(e) if matches!(NvmlCode::from_value(e.ret), NvmlCode::NotSupported | NvmlCode::InvalidArgument) => {
                continue;
            }
            Err(e) => return Err(from_raw(e, &id.uuid)),
        };
        profile.placements = ffi::gi_possible_placements(nvml, dev, profile.id).map_err(|e| from_raw(e, &id.uuid))?;
        profiles.push(profile);
    }
    Ok(NvmlDescription {
        name: id.name.clone(),
        pci_device_id: id.pci_device_id,
        memory_mib: id.memory_mib,
        // The whole-GPU profile has every multiprocessor MIG can use.
        multiprocessors: profiles.iter().map(|p| p.multiprocessor_count).max().unwrap_or(0),
        cuda_compute_capability: id.cuda_compute_capability,
        profiles,
    })
}

/// Whether two models offer the same partitions: profile IDs, slice counts and placements.
pub fn same_partitions(a: &GpuModel, b: &GpuModel) -> bool {
    fn shape(m: &GpuModel) -> Vec<(u32, u32, u32, Vec<u32>)> {
        let mut v: Vec<_> = m
            .profiles
            .iter()
            .map(|p| {
                let mut starts = p.placements.clone();
                starts.sort_unstable();
                (p.id, p.compute_slices, p.memory_slices, starts)
            })
            .collect();
        v.sort();
        v
    }
    a.memory_slices == b.memory_slices && a.compute_slices == b.compute_slices && shape(a) == shape(b)
}

/// A model for a GPU without MIG that the catalog does not know: only the whole GPU is
/// published, and one memory slice stands for it (so it counts as one Slurm shard).
pub fn whole_gpu_model(id: &Identity) -> GpuModel {
    GpuModel {
        key: model_key(&id.name),
        product_name: id.name.clone(),
        nvml_names: Vec::new(),
        pci_device_ids: vec![id.pci_device_id],
        architecture: architecture(id.cuda_compute_capability.0).to_string(),
        cuda_compute_capability: id.cuda_compute_capability,
        memory_mib: id.memory_mib,
        multiprocessors: 0,
        memory_slices: 1,
        compute_slices: 1,
        profiles: Vec::new(),
        evidence: Evidence::Observed,
        note: "from NVML on this GPU; MIG not available, whole GPU only".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity_of(name: &str) -> Identity {
        Identity {
            index: 0,
            minor: 1,
            uuid: "GPU-x".into(),
            pci_bus_id: "00000000:18:00.0".into(),
            pci_device_id: 0x26b9,
            name: name.into(),
            memory_mib: 46068,
            mig: MigState::NotCapable,
            cuda_compute_capability: (8, 9),
        }
    }

    #[test]
    fn a_model_equals_itself_and_not_a_smaller_grid() {
        let h100 = catalog::model("h100-80gb").unwrap();
        assert!(same_partitions(h100, h100));
        let mut fewer = h100.clone();
        fewer.profiles[0].placements.pop();
        assert!(!same_partitions(h100, &fewer));
        assert!(!same_partitions(h100, catalog::model("a30-24gb").unwrap()));
    }

    #[test]
    fn an_unknown_gpu_without_mig_is_one_whole_gpu() {
        let m = whole_gpu_model(&identity_of("NVIDIA L40S"));
        assert_eq!(m.key, "nvidia-l40s");
        assert_eq!((m.memory_slices, m.compute_slices, m.profiles.len()), (1, 1, 0));
        assert_eq!(m.pci_device_ids, [0x26b9]);
    }
}
