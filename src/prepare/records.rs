//! A claim's checkpoint record as prepare, unprepare and admin access share it: a device's record
//! before anything is made for it, a change under the checkpoint lock, which claim holds a GPU
//! instance, and the kubelet's answer made from recorded devices.

use super::instances::holds;
use super::{DeviceStatusData, Engine, GpuEntry, PrepareError, PreparedDevice, status_data};
use crate::claims::ClaimRef;
use crate::gpu::GpuInstance;
use crate::slurm::{self, GpuSlurm};
use crate::state::{ClaimRecord, DeviceRecord, StateError};

impl Engine {
    /// A device of this node's `gpu` as the checkpoint records it, before anything is made for it.
    pub(super) fn device_record(&self, requests: &[String], device: &str, gpu: &GpuEntry) -> DeviceRecord {
        DeviceRecord {
            requests: requests.to_vec(),
            pool: self.opts.pool.clone(),
            device: device.to_string(),
            gpu_uuid: gpu.info.uuid.clone(),
            pci_bus_id: gpu.info.pci_bus_id.clone(),
            gpu_minor: gpu.info.minor,
            gpu_index: gpu.info.index,
            mig: None,
            cdi_ids: Vec::new(),
        }
    }

    /// The claim (other than `uid`) whose checkpoint entry holds this GI, if any.
    pub(super) fn holder(&self, gpu_uuid: &str, gi: &GpuInstance, uid: &str) -> Result<Option<ClaimRef>, StateError> {
        let cp = self.store.read()?;
        Ok(cp.claims.values().filter(|c| c.uid != uid).find_map(|c| {
            c.devices
                .iter()
                .any(|d| d.gpu_uuid == gpu_uuid && d.mig.as_ref().is_some_and(|m| holds(m, gi)))
                .then(|| c.claim())
        }))
    }

    /// Change one claim's record under the checkpoint lock; `None` when the claim is gone.
    pub(super) fn update_claim(
        &self,
        claim: &ClaimRef,
        f: impl FnOnce(&mut ClaimRecord),
    ) -> Result<Option<ClaimRecord>, PrepareError> {
        let r = self.store.update(&self.boot_id, |cp| {
            Ok::<_, std::convert::Infallible>(cp.claims.get_mut(&claim.uid).map(|rec| {
                f(rec);
                rec.clone()
            }))
        });
        match r {
            Ok(Ok(rec)) => Ok(rec),
            Ok(Err(never)) => match never {},
            Err(source) => Err(PrepareError::Checkpoint { claim: Box::new(claim.clone()), source }),
        }
    }

    pub(super) fn prepared(&self, rec: &ClaimRecord) -> Vec<PreparedDevice> {
        self.prepared_with(&rec.devices, status_data)
    }

    /// The kubelet's answer for recorded devices, with the status data `data` makes of each.
    pub(super) fn prepared_with(
        &self,
        devices: &[DeviceRecord],
        data: fn(&DeviceRecord, &GpuSlurm) -> DeviceStatusData,
    ) -> Vec<PreparedDevice> {
        devices
            .iter()
            .map(|d| {
                let unknown = GpuSlurm {
                    index: Some(d.gpu_index),
                    source: slurm::Source::Nvml,
                    shards: 1,
                    memory_slices: 1,
                    migs: Vec::new(),
                };
                let slurm = self.gpu(&d.gpu_uuid).map_or(&unknown, |g| &g.slurm);
                PreparedDevice {
                    requests: d.requests.clone(),
                    pool: d.pool.clone(),
                    device: d.device.clone(),
                    cdi_ids: d.cdi_ids.clone(),
                    status: data(d, slurm),
                }
            })
            .collect()
    }
}
