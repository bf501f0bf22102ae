//! Admin access (`adminAccess: true` in the allocation, e.g. dcgm-exporter): a claim that sees a
//! GPU and every MIG instance on it and owns none of them.
//!
//! Prepare creates, destroys and reserves nothing. It records the claim apart from the claims
//! that hold instances ([`AdminRecord`]), so no overlap check, orphan sweep, status count or
//! packing view ever sees it, then writes a spec exposing the parent GPU and the capability nodes
//! of each instance that exists at that moment. Unprepare removes the spec, then the record.
//!
//! The spec is a snapshot: an instance made later is not in a running container's device cgroup.
//! Every prepare (the kubelet asks again when the pod's containers start) and recovery write it
//! again from the hardware.

use super::error::nvml;
use super::plan::{self, AdminDevice};
use super::{Engine, PrepareError, PreparedDevice, Step, admin_status_data};
use crate::cdi::{self, CdiDevice, InstanceCaps};
use crate::claims::{AllocationResult, ClaimRef};
use crate::gpu::NvmlCode;
use crate::mig::devices::GpuMode;
use crate::state::{AdminRecord, DeviceRecord};

impl Engine {
    /// Prepare an admin-access claim: checkpoint it, then write its spec. Idempotent; a repeated
    /// call writes the spec again with the instances that exist now.
    ///
    /// # Errors
    /// A device that is not on this node, a claim UID already prepared for instances, NVML or
    /// the disk failing; nothing is left behind by a first prepare that fails.
    pub(super) fn prepare_admin(
        &self,
        claim: &ClaimRef,
        results: &[AllocationResult],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let planned = plan::plan_admin(claim, results, &self.opts.driver, &self.opts.pool, &self.gpus)?;
        let record = AdminRecord {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            devices: planned.iter().map(|p| self.admin_device_record(&claim.uid, p)).collect(),
        };
        // Read and checked before anything is written, so a failure leaves nothing behind.
        let devices = self.admin_spec_devices(&record)?;
        self.check_host_nodes(claim, &devices)?;
        let ckpt = |source| PrepareError::Checkpoint { claim: Box::new(claim.clone()), source };
        let known = self.store.read().map_err(ckpt)?.admin.get(&claim.uid) == Some(&record);
        if !known {
            self.store
                .update(&self.boot_id, |cp| {
                    if let Some(rec) = cp.claims.get(&claim.uid) {
                        return Err(changed(claim, rec.devices.iter(), "", &record));
                    }
                    if let Some(old) =
                        cp.admin.get(&claim.uid).filter(|old| names(&old.devices) != names(&record.devices))
                    {
                        return Err(changed(claim, old.devices.iter(), " (admin access)", &record));
                    }
                    cp.admin.insert(claim.uid.clone(), record.clone());
                    Ok(())
                })
                .map_err(ckpt)??;
            self.step(Step::PrepareStarted);
        }
        if let Err(source) = self.cdi.ensure(&claim.uid, &devices) {
            if !known {
                let _ = self.cdi.remove(&claim.uid);
                let _ = self.store.update(&self.boot_id, |cp| {
                    cp.admin.remove(&claim.uid);
                    Ok::<_, std::convert::Infallible>(())
                });
            }
            return Err(PrepareError::Cdi { claim: Box::new(claim.clone()), source });
        }
        self.step(Step::CdiWritten);
        self.step(Step::PrepareCompleted);
        Ok(self.prepared_with(&record.devices, admin_status_data))
    }

    /// Unprepare an admin-access claim: its spec, then its record. Nothing on the hardware.
    ///
    /// # Errors
    /// The spec cannot be removed or the checkpoint written; the record stays for the retry.
    pub(super) fn unprepare_admin(&self, rec: &AdminRecord) -> Result<(), PrepareError> {
        let claim = rec.claim();
        self.cdi.remove(&rec.uid).map_err(|source| PrepareError::Cdi { claim: Box::new(claim.clone()), source })?;
        self.step(Step::CdiDeleted);
        self.store
            .update(&self.boot_id, |cp| {
                cp.admin.remove(&rec.uid);
                Ok::<_, std::convert::Infallible>(())
            })
            .map_err(|source| PrepareError::Checkpoint { claim: Box::new(claim), source })?
            .unwrap_or_else(|never| match never {});
        self.step(Step::ClaimDropped);
        Ok(())
    }

    /// Write an admin claim's spec again from the hardware (recovery); returns what it was.
    ///
    /// # Errors
    /// NVML or the disk fails.
    pub(super) fn repair_admin_spec(&self, rec: &AdminRecord) -> Result<cdi::SpecState, PrepareError> {
        let devices = self.admin_spec_devices(rec)?;
        let (_, state) = self
            .cdi
            .ensure(&rec.uid, &devices)
            .map_err(|source| PrepareError::Cdi { claim: Box::new(rec.claim()), source })?;
        Ok(state)
    }

    fn admin_device_record(&self, uid: &str, p: &AdminDevice<'_>) -> DeviceRecord {
        let cdi_ids = vec![self.cdi.qualified_id(&cdi::device_name(uid, &p.device))];
        DeviceRecord { cdi_ids, ..self.device_record(&p.requests, &p.device, p.gpu) }
    }

    /// One spec device per allocated device: its GPU and every instance on it now.
    fn admin_spec_devices(&self, rec: &AdminRecord) -> Result<Vec<CdiDevice>, PrepareError> {
        let claim = rec.claim();
        let mut caps_major = None;
        let mut out = Vec::with_capacity(rec.devices.len());
        for d in &rec.devices {
            let name = cdi::device_name(&rec.uid, &d.device);
            let dev = d.device.as_str();
            let mut instances = Vec::new();
            if let Some(gpu) = self.gpu(&d.gpu_uuid).filter(|g| g.mode != GpuMode::Full) {
                let uuid = gpu.info.uuid.as_str();
                let gis = match self.backend.gpu_instances(uuid) {
                    Err(e) if e.code() == Some(NvmlCode::NotSupported) => Vec::new(),
                    r => nvml(&claim, dev, "list GPU instances", || r)?,
                };
                for gi in gis {
                    for ci in
                        nvml(&claim, dev, "list compute instances", || self.backend.compute_instances(uuid, gi.id))?
                    {
                        let (gi_cap_minor, ci_cap_minor) = nvml(&claim, dev, "read the capability minors", || {
                            self.backend.mig_capability_minors(gpu.info.minor, gi.id, ci.id)
                        })?;
                        instances.push(InstanceCaps { gi_cap_minor, ci_cap_minor });
                    }
                }
            }
            let major = match (caps_major, instances.is_empty()) {
                (_, true) => 0,
                (Some(major), false) => major,
                (None, false) => {
                    *caps_major.insert(nvml(&claim, dev, "read the nvidia-caps major", || self.backend.caps_major())?)
                }
            };
            out.push(cdi::admin_device(name, d.gpu_minor, &d.gpu_uuid, &instances, major));
        }
        Ok(out)
    }
}

fn names(devices: &[DeviceRecord]) -> Vec<&str> {
    let mut names: Vec<&str> = devices.iter().map(|d| d.device.as_str()).collect();
    names.sort_unstable();
    names
}

fn changed<'a>(
    claim: &ClaimRef,
    was: impl Iterator<Item = &'a DeviceRecord>,
    was_kind: &str,
    now: &AdminRecord,
) -> PrepareError {
    let was: Vec<&str> = was.map(|d| d.device.as_str()).collect();
    PrepareError::AllocationChanged {
        claim: Box::new(claim.clone()),
        was: format!("{}{was_kind}", was.join(", ")),
        now: format!("{} (admin access)", names(&now.devices).join(", ")),
    }
}
