//! Unprepare: delete the claim's CDI spec and device metadata files, destroy its dynamic instances (CI, then GI) after
//! checking they are still the ones it made, and forget the claim. Two durable checkpoint writes:
//! `UnprepareStarted` before anything is torn down, and the claim's removal once all is gone.

use super::error::nvml;
use super::instances::{gone_ok, holds};
use super::{Engine, PrepareError, Step};
use crate::claims::ClaimRef;
use crate::gpu::NvmlCode;
use crate::state::{ClaimState, DeviceRecord, MigOwner, MigRecord};

impl Engine {
    /// Unprepare a claim: delete its CDI spec, destroy its dynamic instances (CI, then GI), forget
    /// it. An unknown claim succeeds.
    ///
    /// `UnprepareStarted` is checkpointed before the spec goes, so a crash part-way is finished by
    /// recovery, not taken for a prepared claim whose spec needs writing again. Nothing is
    /// written per destroyed instance: until the claim is dropped its record keeps the placement
    /// from every other claim, so a retry finds by the record what is left, and nothing else.
    ///
    /// # Errors
    /// NVML refuses a destroy (e.g. IN_USE); the claim stays UnprepareStarted for the retry.
    pub fn unprepare(&self, uid: &str) -> Result<(), PrepareError> {
        let _claim = self.claims.lock(uid);
        // Named by its UID alone until the checkpoint says whose it is.
        let ckpt = |source| PrepareError::Checkpoint { claim: Box::new(ClaimRef::new(uid, "", "")), source };
        let cp = self.store.read().map_err(ckpt)?;
        if let Some(admin) = cp.admin.get(uid) {
            return self.unprepare_admin(admin);
        }
        let Some(rec) = cp.claims.get(uid).cloned() else {
            return Ok(());
        };
        let claim = rec.claim();
        if rec.state != ClaimState::UnprepareStarted {
            self.update_claim(&claim, |r| r.state = ClaimState::UnprepareStarted)?;
            self.step(Step::UnprepareStarted);
        }
        self.cdi.remove(uid).map_err(|source| PrepareError::Cdi { claim: Box::new(claim.clone()), source })?;
        self.remove_metadata(&claim)?;
        self.step(Step::CdiDeleted);
        for d in rec.devices.iter().rev() {
            let Some(m) = d.mig.as_ref().filter(|m| m.owner == MigOwner::Dynamic) else { continue };
            if let Err(e) = self.release(&claim, d, m) {
                let _ = self.update_claim(&claim, |r| r.last_error = Some(e.to_string()));
                return Err(e);
            }
        }
        self.store
            .update(&self.boot_id, |cp| {
                cp.claims.remove(uid);
                Ok::<_, std::convert::Infallible>(())
            })
            .map_err(ckpt)?
            .unwrap_or_else(|never| match never {});
        self.step(Step::ClaimDropped);
        Ok(())
    }

    /// Destroy one dynamic instance of a claim, after checking it is still the one we made: same
    /// profile and placement, and held by no other claim (GI IDs are reused by the driver).
    pub(super) fn release(&self, claim: &ClaimRef, d: &DeviceRecord, m: &MigRecord) -> Result<(), PrepareError> {
        let Some(gpu) = self.gpu(&d.gpu_uuid) else { return Ok(()) };
        let uuid = gpu.info.uuid.as_str();
        let dev = d.device.as_str();
        let _guard = self.lock_gpu(gpu, claim, dev)?;
        let gis = match self.backend.gpu_instances(uuid) {
            Err(e) if e.code() == Some(NvmlCode::NotSupported) => return Ok(()),
            // Fallen off the bus: its instances cannot be reached, and the GPU's reset takes
            // them. Holding the claim would only make the kubelet retry for ever.
            Err(e) if e.code() == Some(NvmlCode::GpuIsLost) => {
                tracing::warn!(claim = %claim, device = dev, gpu = uuid, gi = ?m.gi_id,
                    "GPU is lost: the claim's instance could not be destroyed and goes with the \
                     GPU's reset; unprepare completes: {e}");
                return Ok(());
            }
            r => nvml(claim, dev, "list GPU instances", || r)?,
        };
        let Some(gi) = gis.iter().find(|g| holds(m, g)) else { return Ok(()) };
        let other = self
            .holder(uuid, gi, &claim.uid)
            .map_err(|source| PrepareError::Checkpoint { claim: Box::new(claim.clone()), source })?;
        if other.is_some() {
            return Ok(());
        }
        let cis = nvml(claim, dev, "list compute instances", || self.backend.compute_instances(uuid, gi.id))?;
        for ci in cis {
            gone_ok(self.backend.destroy_compute_instance(uuid, gi.id, ci.id)).map_err(|source| {
                PrepareError::Nvml {
                    claim: Box::new(claim.clone()),
                    device: dev.into(),
                    step: "destroy the compute instance",
                    source,
                }
            })?;
            self.step(Step::CiDestroyed);
        }
        gone_ok(self.backend.destroy_gpu_instance(uuid, gi.id)).map_err(|source| PrepareError::Nvml {
            claim: Box::new(claim.clone()),
            device: dev.into(),
            step: "destroy the GPU instance",
            source,
        })?;
        self.step(Step::GiDestroyed);
        Ok(())
    }
}
