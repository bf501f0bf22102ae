//! Prepare: make a claim's devices exist at exactly the allocated placements, write the CDI spec,
//! and roll back within the same call whatever a failure leaves behind. Two durable checkpoint
//! writes: the intent before the first NVML mutation, and the completion with everything NVML
//! made once the spec is on disk.

use super::error::nvml;
use super::instances::destroy_gi;
use super::plan::{self, PlannedDevice};
use super::{Engine, PrepareError, PreparedDevice, Step};
use crate::claims::{AllocationResult, Claim, ClaimRef};
use crate::mig::naming;
use crate::state::{Checkpoint, ClaimRecord, ClaimState, DeviceRecord, MigOwner, MigRecord};

/// What one device of a claim holds on the hardware while a prepare runs, for rollback.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Held {
    gi: Option<u32>,
    ci: Option<u32>,
}

impl Engine {
    /// Prepare a claim: make every allocated device of our driver exist and return its CDI IDs.
    /// Idempotent: a completed claim returns its devices again without touching NVML.
    ///
    /// # Errors
    /// Only this claim fails; whatever this call created has been destroyed again.
    pub fn prepare(&self, claim: &ClaimRef, results: &[AllocationResult]) -> Result<Vec<PreparedDevice>, PrepareError> {
        self.prepare_with(claim, results, None)
    }

    /// [`Engine::prepare`] for a claim as its source found it: a claim made from a template gets
    /// its device metadata where its pod looks for it (under the pod's name for the claim).
    ///
    /// # Errors
    /// As [`Engine::prepare`].
    pub fn prepare_claim(&self, claim: &Claim) -> Result<Vec<PreparedDevice>, PrepareError> {
        self.prepare_with(&claim.claim, &claim.results, claim.pod_claim_name.as_deref())
    }

    fn prepare_with(
        &self,
        claim: &ClaimRef,
        results: &[AllocationResult],
        pod_claim_name: Option<&str>,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let _claim = self.claims.lock(&claim.uid);
        if plan::is_admin(claim, results, &self.opts.driver)? {
            return self.prepare_admin(claim, results);
        }
        let planned = plan::plan(claim, results, &self.opts.driver, &self.opts.pool, &self.gpus)?;
        let names: Vec<&str> = planned.iter().map(|p| p.device.as_str()).collect();
        let ckpt = |source| PrepareError::Checkpoint { claim: Box::new(claim.clone()), source };

        if let Some(rec) = self.store.read().map_err(ckpt)?.claims.get(&claim.uid) {
            same_allocation(claim, rec, &names)?;
            if rec.state == ClaimState::PrepareCompleted && !rec.needs_recreate {
                // The kubelet asks again when a container (re)starts: the runtime will resolve the
                // IDs we return, so the spec behind them must still be there.
                self.repair_files(rec)?;
                return Ok(self.prepared(rec));
            }
        }
        // Only before a new prepare: a running claim is not failed because Slurm's order changed.
        self.check_slurm_prefixes(claim, &planned)?;
        let record = self
            .store
            .update(&self.boot_id, |cp| self.start(cp, claim, pod_claim_name, &planned, &names))
            .map_err(ckpt)??;
        self.step(Step::PrepareStarted);

        let mut held = vec![Held::default(); planned.len()];
        match self.make(claim, &planned, &record, &mut held) {
            Ok(devices) => Ok(devices),
            Err(e) => {
                let rollback = self.rollback(claim, &planned, &held, &e.to_string());
                Err(match rollback {
                    Ok(()) => e,
                    Err(left) => PrepareError::RollbackIncomplete { source: Box::new(e), left },
                })
            }
        }
    }

    /// Refuse a device whose name carries a Slurm index (`--device-names slurm`) other than the
    /// actual one of its GPU (whole GPU) or static instance. Reads NVML for static instances only;
    /// a missing instance is left for [`Self::ensure_mig`] to report.
    fn check_slurm_prefixes(&self, claim: &ClaimRef, planned: &[PlannedDevice<'_>]) -> Result<(), PrepareError> {
        for p in planned.iter().filter(|p| p.slurm_prefix.is_some()) {
            let gpu = p.gpu;
            let (actual, what) = match &p.mig {
                None => (gpu.slurm.index, format!("GPU minor {}", gpu.info.minor)),
                Some(m) => {
                    let uuid = gpu.info.uuid.as_str();
                    let gis = nvml(claim, &p.device, "list GPU instances", || self.backend.gpu_instances(uuid))?;
                    let Some(gi) = gis.iter().find(|g| g.profile_id == m.profile.id && g.start == m.start) else {
                        continue;
                    };
                    let ci = nvml(claim, &p.device, "list compute instances", || {
                        self.backend.compute_instances(uuid, gi.id)
                    })?
                    .into_iter()
                    .next();
                    let actual = ci.and_then(|ci| gpu.slurm.mig_index(gi.id, ci.id));
                    (
                        actual,
                        format!(
                            "the {} instance at placement {} on GPU minor {}",
                            m.profile.name, m.start, gpu.info.minor
                        ),
                    )
                }
            };
            plan::check_prefix(p.slurm_prefix, actual, &what)
                .map_err(|reason| PrepareError::bad(claim, &p.device, reason))?;
        }
        Ok(())
    }

    /// Inside the checkpoint lock: refuse devices held by other claims, then record the intent.
    pub(super) fn start(
        &self,
        cp: &mut Checkpoint,
        claim: &ClaimRef,
        pod_claim_name: Option<&str>,
        planned: &[PlannedDevice<'_>],
        names: &[&str],
    ) -> Result<ClaimRecord, PrepareError> {
        for other in cp.claims.values().filter(|c| c.uid != claim.uid) {
            // By partition, not by name: the same GPU may be allocated as `gpu-1` and `0003-gpu-1`
            // when --device-names changed between two allocations.
            let same = |d: &DeviceRecord| {
                planned.iter().any(|p| p.gpu.info.uuid == d.gpu_uuid && naming::same_partition(&p.device, &d.device))
            };
            if let Some(d) = other.devices.iter().find(|d| same(d)) {
                return Err(PrepareError::DeviceInUse {
                    claim: Box::new(claim.clone()),
                    device: d.device.clone(),
                    other: Box::new(other.claim()),
                });
            }
            // Said here, with both claims named, rather than as NVML's bare INSUFFICIENT_RESOURCES.
            for p in planned {
                let Some(m) = &p.mig else { continue };
                let (start, end) = (m.start, m.start + m.profile.memory_slices);
                let held = other.devices.iter().find(|d| {
                    d.gpu_uuid == p.gpu.info.uuid
                        && d.mig.as_ref().is_some_and(|o| o.start < end && start < o.start + o.size)
                });
                if let Some(d) = held {
                    return Err(PrepareError::Overlaps {
                        claim: Box::new(claim.clone()),
                        device: p.device.clone(),
                        held: d.device.clone(),
                        other: Box::new(other.claim()),
                    });
                }
            }
        }
        if let Some(admin) = cp.admin.get(&claim.uid) {
            let was: Vec<&str> = admin.devices.iter().map(|d| d.device.as_str()).collect();
            return Err(PrepareError::AllocationChanged {
                claim: Box::new(claim.clone()),
                was: format!("{} (admin access)", was.join(", ")),
                now: names.join(", "),
            });
        }
        let earlier = cp.claims.get(&claim.uid);
        if let Some(rec) = earlier {
            same_allocation(claim, rec, names)?;
        }
        let devices = planned
            .iter()
            .map(|p| {
                let before = earlier.and_then(|r| r.devices.iter().find(|d| d.device == p.device));
                DeviceRecord {
                    mig: p.mig.as_ref().map(|m| {
                        let intent =
                            MigRecord::intent(m.owner, m.profile.id, &m.profile.name, m.start, m.profile.memory_slices);
                        // Keep what an earlier attempt made, if it was for the same partition.
                        before.and_then(|b| b.mig.clone()).filter(|k| k.forgotten() == intent).unwrap_or(intent)
                    }),
                    ..self.device_record(&p.requests, &p.device, p.gpu)
                }
            })
            .collect();
        let record = ClaimRecord {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            pod_claim_name: pod_claim_name.map(str::to_string),
            state: ClaimState::PrepareStarted,
            devices,
            needs_recreate: earlier.is_some_and(|r| r.needs_recreate),
            last_error: None,
        };
        cp.claims.insert(claim.uid.clone(), record.clone());
        Ok(record)
    }

    /// Create (or adopt) every device, write the CDI spec, complete the claim.
    ///
    /// What NVML made (GI and CI IDs, MIG UUID, capability minors) stays in memory until the
    /// completion, the one durable write here. A crash before it leaves the intent alone in the
    /// checkpoint, which is enough: the intent reserves the placement against every other claim,
    /// so whatever stands there is this claim's, found by profile and placement, adopted by the
    /// retry or destroyed by an unprepare, and never swept as an orphan.
    pub(super) fn make(
        &self,
        claim: &ClaimRef,
        planned: &[PlannedDevice<'_>],
        record: &ClaimRecord,
        held: &mut [Held],
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        let mut devices = record.devices.clone();
        for (i, p) in planned.iter().enumerate() {
            if let Some(m) = &record.devices[i].mig {
                devices[i].mig = Some(self.ensure_mig(claim, p, m, &mut held[i])?);
            }
        }
        let made = ClaimRecord { devices: devices.clone(), ..record.clone() };
        // Before the spec that mounts them: the runtime needs the files when it reads the spec.
        self.ensure_metadata(&made)?;
        self.step(Step::MetadataWritten);
        let cdi_devices = self.claim_spec(&made)?;
        self.check_host_nodes(claim, &cdi_devices)?;
        // Not synced: the completion below is, and the spec is written again from it.
        let ids = self
            .cdi
            .write(&claim.uid, &cdi_devices)
            .map_err(|source| PrepareError::Cdi { claim: Box::new(claim.clone()), source })?;
        self.step(Step::CdiWritten);
        for (d, id) in devices.iter_mut().zip(&ids) {
            d.cdi_ids = vec![id.clone()];
        }
        let complete = |rec: &mut ClaimRecord| {
            rec.state = ClaimState::PrepareCompleted;
            rec.needs_recreate = false;
            for (d, made) in rec.devices.iter_mut().zip(&devices) {
                d.mig.clone_from(&made.mig);
                d.cdi_ids.clone_from(&made.cdi_ids);
            }
        };
        let done = self.update_claim(claim, complete)?.unwrap_or_else(|| {
            let mut rec = record.clone();
            complete(&mut rec);
            rec
        });
        self.step(Step::PrepareCompleted);
        Ok(self.prepared(&done))
    }

    /// The GPU's lock, for one device of a claim: [`PrepareError::Busy`] when another process
    /// (the other pod of a rolling update) holds it past the lock timeout.
    pub(super) fn lock_gpu<'g>(
        &self,
        gpu: &'g super::GpuEntry,
        claim: &ClaimRef,
        device: &str,
    ) -> Result<super::locks::GpuGuard<'g>, PrepareError> {
        gpu.lock.lock(self.opts.lock_timeout).map_err(|source| PrepareError::Busy {
            claim: Box::new(claim.clone()),
            device: device.into(),
            source,
        })
    }

    /// Make one MIG device exist and return its record with IDs, UUID and capability minors; the
    /// caller checkpoints it with the completion.
    pub(super) fn ensure_mig(
        &self,
        claim: &ClaimRef,
        p: &PlannedDevice<'_>,
        m: &MigRecord,
        held: &mut Held,
    ) -> Result<MigRecord, PrepareError> {
        let gpu = p.gpu;
        let uuid = gpu.info.uuid.as_str();
        let dev = p.device.as_str();
        let _guard = self.lock_gpu(gpu, claim, dev)?;
        let gis = nvml(claim, dev, "list GPU instances", || self.backend.gpu_instances(uuid))?;
        let at_placement = gis.iter().find(|g| g.profile_id == m.profile_id && g.start == m.start);
        let mut m = m.clone();
        let gi = match (at_placement, m.owner) {
            (Some(g), MigOwner::Static) => g.id,
            (None, MigOwner::Static) => {
                return Err(PrepareError::bad(
                    claim,
                    dev,
                    format!("no {} instance at placement {} exists on this static-MIG GPU", m.profile, m.start),
                ));
            }
            (Some(g), MigOwner::Dynamic) => {
                if let Some(other) = self
                    .holder(uuid, g, &claim.uid)
                    .map_err(|source| PrepareError::Checkpoint { claim: Box::new(claim.clone()), source })?
                {
                    return Err(PrepareError::DeviceInUse {
                        claim: Box::new(claim.clone()),
                        device: dev.into(),
                        other: Box::new(other),
                    });
                }
                // Ours from an earlier attempt that crashed before completing: only its intent
                // was checkpointed, and that intent keeps every other claim off this placement.
                // Adopt it.
                g.id
            }
            (None, MigOwner::Dynamic) => {
                let g = nvml(claim, dev, "create the GPU instance", || {
                    self.backend.create_gpu_instance(uuid, m.profile_id, m.start)
                })?;
                held.gi = Some(g.id);
                self.step(Step::GiCreated);
                g.id
            }
        };
        held.gi = Some(gi);
        m.gi_id = Some(gi);
        let cis = nvml(claim, dev, "list compute instances", || self.backend.compute_instances(uuid, gi))?;
        let ci = match cis.into_iter().next() {
            Some(ci) => ci,
            None if m.owner == MigOwner::Static => {
                return Err(PrepareError::bad(claim, dev, format!("static GPU instance {gi} has no compute instance")));
            }
            None => {
                let ci_profile =
                    p.mig.as_ref().and_then(|pm| pm.profile.default_ci()).map(|c| c.id).unwrap_or_default();
                let ci = nvml(claim, dev, "create the compute instance", || {
                    self.backend.create_compute_instance(uuid, gi, ci_profile)
                })?;
                held.ci = Some(ci.id);
                self.step(Step::CiCreated);
                ci
            }
        };
        held.ci = Some(ci.id);
        let (gi_cap, ci_cap) = nvml(claim, dev, "read the capability minors", || {
            self.backend.mig_capability_minors(gpu.info.minor, gi, ci.id)
        })?;
        m.ci_id = Some(ci.id);
        m.uuid = Some(ci.uuid);
        m.gi_cap_minor = Some(gi_cap);
        m.ci_cap_minor = Some(ci_cap);
        Ok(m)
    }

    /// Undo a failed prepare: destroy the instances this claim holds (CI, then GI), delete its
    /// CDI spec and metadata files and drop it from the checkpoint. If something cannot be destroyed the claim stays
    /// in the checkpoint with the error, so the next prepare or unprepare finishes the job.
    pub(super) fn rollback(
        &self,
        claim: &ClaimRef,
        planned: &[PlannedDevice<'_>],
        held: &[Held],
        error: &str,
    ) -> Result<(), String> {
        let mut left = Vec::new();
        for (p, h) in planned.iter().zip(held).rev() {
            if p.mig.as_ref().is_none_or(|m| m.owner != MigOwner::Dynamic) {
                continue;
            }
            let Some(gi) = h.gi else { continue };
            let uuid = p.gpu.info.uuid.as_str();
            let Ok(_guard) = p.gpu.lock.lock(self.opts.lock_timeout) else {
                left.push(format!("{}: GPU lock", p.device));
                continue;
            };
            if let Err(e) = destroy_gi(self.backend.as_ref(), uuid, gi, h.ci) {
                left.push(format!("{}: {e}", p.device));
            }
        }
        let _ = self.cdi.remove(&claim.uid);
        let _ = self.remove_metadata(claim);
        let error = error.to_string();
        let outcome = self.store.update(&self.boot_id, |cp| {
            if left.is_empty() {
                cp.claims.remove(&claim.uid);
            } else if let Some(rec) = cp.claims.get_mut(&claim.uid) {
                rec.last_error = Some(error);
            }
            Ok::<_, std::convert::Infallible>(())
        });
        if let Err(e) = outcome {
            left.push(format!("checkpoint: {e}"));
        }
        if left.is_empty() { Ok(()) } else { Err(left.join("; ")) }
    }
}

fn same_allocation(claim: &ClaimRef, rec: &ClaimRecord, names: &[&str]) -> Result<(), PrepareError> {
    let mut was: Vec<&str> = rec.devices.iter().map(|d| d.device.as_str()).collect();
    let mut now = names.to_vec();
    was.sort_unstable();
    now.sort_unstable();
    if was == now {
        return Ok(());
    }
    Err(PrepareError::AllocationChanged { claim: Box::new(claim.clone()), was: was.join(", "), now: now.join(", ") })
}

#[cfg(test)]
mod tests {
    use super::super::Options;
    use super::*;
    use crate::gpu::GpuBackend;
    use crate::gpu::sim::{Fault, SimBackend, SimSpec};
    use crate::mig::catalog;
    use crate::mig::naming::DeviceName;
    use std::sync::Arc;

    const DRIVER: &str = "mig.slinky.slurm.net";

    /// A prepare that fails after creating its GPU instance, and whose rollback cannot destroy
    /// it, still reports (and is counted under) the failure it had, with what was left behind.
    #[test]
    fn a_failed_rollback_keeps_the_original_error() {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(SimBackend::in_memory(&SimSpec::parse("h100-80gb:1").unwrap()));
        let opts = Options::new(DRIVER, "node-a", dir.path().join("state"), dir.path().join("cdi"));
        let engine = Engine::new(sim.clone(), opts).unwrap();
        let gpu = sim.gpus().unwrap().remove(0);
        let profile = catalog::model("h100-80gb").unwrap().profile(14).unwrap().name.clone();
        let device = DeviceName::mig(gpu.minor, &profile, 14, 2).to_string();
        sim.add_fault(Fault::parse("create-ci=insufficient-resources:1").unwrap()).unwrap();
        sim.add_fault(Fault::parse("destroy-gi=in-use:1").unwrap()).unwrap();
        let claim = ClaimRef::new("0b6f4a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "ml", "c");
        let result = AllocationResult {
            request: "gpu".into(),
            driver: DRIVER.into(),
            pool: "node-a".into(),
            device: device.clone(),
            admin_access: None,
        };

        let err = engine.prepare(&claim, &[result]).unwrap_err();
        assert_eq!(err.reason(), "nvml-insufficient-resources", "{err}");
        let text = err.to_string();
        let original = format!("claim {claim}: device {device}: failed to create the compute instance");
        assert!(text.starts_with(&original), "{text}");
        assert!(text.contains("rollback left instances behind") && text.contains("in-use"), "{text}");
        assert_eq!(sim.gpu_instances(&gpu.uuid).unwrap().len(), 1, "the instance the rollback could not destroy");
        assert!(engine.checkpoint().unwrap().claims[&claim.uid].last_error.is_some(), "kept for the retry");
    }
}
