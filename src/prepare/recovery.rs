//! Startup recovery: make the checkpoint and the hardware agree before serving.
//!
//! - A corrupt checkpoint is moved aside and rebuilt from what the hardware and our CDI specs
//!   prove; the daemon keeps serving (NVIDIA's driver crash-loops here).
//! - A new boot ID means every instance is gone: claims are kept, marked for re-creation, and the
//!   kubelet's next prepare re-creates them at the same placements.
//! - Claims caught mid-unprepare are finished.
//! - CDI specs of claims the checkpoint does not know are removed, readable or not, and so are
//!   their device metadata files; prepared claims whose spec or metadata is missing or changed get
//!   it written again. Specs are not fsynced
//!   ([`CdiWriter`](crate::cdi::CdiWriter)): this makes a spec that a power loss emptied or
//!   brought back harmless.
//! - A claim caught mid-prepare has only its intent in the checkpoint: its instances, if any, are
//!   found by profile and placement, left alone by the orphan sweep, and adopted by the kubelet's
//!   retry or destroyed by its unprepare.
//! - Admin-access claims hold no instance: their specs are written again with the instances
//!   there are now, and a rebuilt checkpoint knows them by their spec's `MIGDRA_ADMIN_ACCESS`.
//! - MIG instances on dynamic GPUs that no claim explains are destroyed, kept or reported
//!   (`--orphans`); instances on static GPUs are never touched.

use super::instances::{destroy_gi, holds};
use super::{Engine, GpuEntry, PrepareError, Step};
use crate::cdi;
use crate::gpu::NvmlCode;
use crate::mig::devices::GpuMode;
use crate::mig::naming::DeviceName;
use crate::state::{AdminRecord, Checkpoint, ClaimRecord, ClaimState, DeviceRecord, Loaded, MigOwner, MigRecord};
use serde::Serialize;
use std::path::PathBuf;

/// What to do with MIG instances on a dynamic GPU that no claim explains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OrphanPolicy {
    /// Destroy them: on a dynamic GPU migdra owns every instance
    #[default]
    Destroy,
    /// Leave them and say nothing more than an info line
    Keep,
    /// Leave them and warn
    Report,
}

/// What happened to one orphan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OrphanAction {
    Destroyed,
    Kept,
    Reported,
    DestroyFailed(String),
}

/// An instance no claim explains.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Orphan {
    pub gpu: String,
    pub gi_id: u32,
    pub profile_id: u32,
    pub start: u32,
    pub action: OrphanAction,
}

/// What recovery found and did; the daemon logs it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryReport {
    /// `fresh`, `loaded`, or `corrupt`.
    pub checkpoint: &'static str,
    /// Where a corrupt checkpoint went, and why it was refused.
    pub corrupt: Option<(PathBuf, String)>,
    /// Claims rebuilt from CDI specs and the hardware after a corrupt checkpoint.
    pub rebuilt_claims: Vec<String>,
    pub boot_changed: bool,
    /// Claims whose instances vanished with a reboot; the next prepare re-creates them.
    pub marked_for_recreate: Vec<String>,
    pub finished_unprepares: Vec<String>,
    pub failed_unprepares: Vec<(String, String)>,
    pub stale_cdi_specs_removed: Vec<String>,
    /// Device metadata of claims the checkpoint does not hold, removed: `namespace/name`.
    pub stale_metadata_removed: Vec<String>,
    /// Prepared claims whose CDI spec was missing or changed on disk, written again: (UID, what).
    pub repaired_cdi_specs: Vec<(String, &'static str)>,
    pub failed_spec_repairs: Vec<(String, String)>,
    pub orphans: Vec<Orphan>,
}

impl Engine {
    /// Run recovery once, before serving.
    ///
    /// # Errors
    /// Only I/O failures of the checkpoint itself; content problems are repaired.
    pub fn recover(&self) -> Result<RecoveryReport, PrepareError> {
        let ckpt = PrepareError::NodeCheckpoint;
        let mut report = RecoveryReport::default();
        let mut cp = match self.store.load().map_err(ckpt)? {
            Loaded::Fresh(c) => {
                report.checkpoint = "fresh";
                c
            }
            Loaded::Ok(c) => {
                report.checkpoint = "loaded";
                c
            }
            Loaded::Corrupt { moved_to, reason, .. } => {
                report.checkpoint = "corrupt";
                report.corrupt = Some((moved_to, reason));
                let cp = self.rebuild();
                report.rebuilt_claims = cp.claims.keys().chain(cp.admin.keys()).cloned().collect();
                cp
            }
        };
        if !cp.boot_id.is_empty() && cp.boot_id != self.boot_id {
            report.boot_changed = true;
            cp.claims.retain(|_, c| c.state != ClaimState::UnprepareStarted);
            for c in cp.claims.values_mut() {
                forget_instances(c);
                report.marked_for_recreate.push(c.uid.clone());
            }
        }
        cp.boot_id.clone_from(&self.boot_id);
        self.store.replace(&cp).map_err(ckpt)?;
        if report.boot_changed {
            self.step(Step::RecreateMarked);
        }

        for c in cp.claims.values().filter(|c| c.state == ClaimState::UnprepareStarted) {
            match self.unprepare(&c.uid) {
                Ok(()) => report.finished_unprepares.push(c.uid.clone()),
                Err(e) => report.failed_unprepares.push((c.uid.clone(), e.to_string())),
            }
        }
        if let Ok((specs, unreadable)) = self.cdi.list() {
            let cp = self.store.read().map_err(ckpt)?;
            // Unreadable ones too: specs are not synced, so a power loss can leave one empty.
            let uids = specs
                .into_iter()
                .map(|(uid, _)| uid)
                .chain(unreadable.iter().filter_map(|(p, _)| self.cdi.claim_of(p)));
            for uid in uids.filter(|uid| !cp.holds(uid)) {
                if self.cdi.remove(&uid).is_ok() {
                    report.stale_cdi_specs_removed.push(uid);
                    self.step(Step::StaleSpecRemoved);
                }
            }
        }
        report.stale_metadata_removed = self.remove_stale_metadata();
        let cp = self.store.read().map_err(ckpt)?;
        for c in cp.claims.values().filter(|c| c.state == ClaimState::PrepareCompleted && !c.needs_recreate) {
            match self.repair_files(c) {
                Ok(cdi::SpecState::Intact) => {}
                Ok(state) => report.repaired_cdi_specs.push((c.uid.clone(), state.as_str())),
                Err(e) => report.failed_spec_repairs.push((c.uid.clone(), e.to_string())),
            }
        }
        // After a reboot too: the spec then lists the instances there are now.
        for a in cp.admin.values() {
            match self.repair_admin_spec(a) {
                Ok(cdi::SpecState::Intact) => {}
                Ok(state) => report.repaired_cdi_specs.push((a.uid.clone(), state.as_str())),
                Err(e) => report.failed_spec_repairs.push((a.uid.clone(), e.to_string())),
            }
        }
        report.orphans = self.sweep_orphans()?;
        Ok(report)
    }

    /// A checkpoint from our CDI specs and the hardware: each spec names its claim and devices,
    /// and a MIG device's UUID finds its instance. Devices whose instance is gone are kept as
    /// intents for re-creation.
    fn rebuild(&self) -> Checkpoint {
        let mut cp = Checkpoint { boot_id: self.boot_id.clone(), ..Default::default() };
        let Ok((specs, _)) = self.cdi.list() else { return cp };
        for (uid, spec) in specs {
            let admin = spec.devices.iter().any(|d| d.env(cdi::ADMIN_VAR) == Some("true"));
            let mut devices = Vec::new();
            let mut complete = true;
            for d in &spec.devices {
                let Some(name) = cdi::split_device_name(&uid, &d.name) else { continue };
                let Ok(decoded) = DeviceName::parse(name) else { continue };
                let Some(gpu) = self.gpus.iter().find(|g| g.info.minor == decoded.minor()) else { continue };
                let mig = match decoded {
                    _ if admin => None,
                    DeviceName::Gpu { .. } => None,
                    DeviceName::Mig { profile_id, start, .. } => {
                        let uuid = d.env("NVIDIA_VISIBLE_DEVICES").unwrap_or_default();
                        let m = self.find_by_uuid(gpu, profile_id, start, uuid);
                        complete &= m.as_ref().is_some_and(|m| m.gi_id.is_some());
                        m
                    }
                };
                devices.push(DeviceRecord {
                    requests: Vec::new(),
                    pool: self.opts.pool.clone(),
                    device: name.to_string(),
                    gpu_uuid: gpu.info.uuid.clone(),
                    pci_bus_id: gpu.info.pci_bus_id.clone(),
                    gpu_minor: gpu.info.minor,
                    gpu_index: gpu.info.index,
                    mig,
                    cdi_ids: vec![format!("{}={}", spec.kind, d.name)],
                });
            }
            if devices.is_empty() {
                continue;
            }
            if admin {
                let (namespace, name) = (String::new(), String::new());
                cp.admin.insert(uid.clone(), AdminRecord { uid, namespace, name, devices });
                continue;
            }
            let record = ClaimRecord {
                uid: uid.clone(),
                namespace: String::new(),
                name: String::new(),
                pod_claim_name: None,
                state: if complete { ClaimState::PrepareCompleted } else { ClaimState::PrepareStarted },
                devices,
                needs_recreate: !complete,
                last_error: Some("rebuilt from the CDI spec after a corrupt checkpoint".into()),
            };
            cp.claims.insert(uid, record);
        }
        cp
    }

    /// The MIG record of the instance at (profile, start) whose CI has this UUID; without such an
    /// instance, the bare intent.
    fn find_by_uuid(&self, gpu: &GpuEntry, profile_id: u32, start: u32, uuid: &str) -> Option<MigRecord> {
        let profile = gpu.model.profile(profile_id)?;
        let owner = if gpu.mode == GpuMode::Static { MigOwner::Static } else { MigOwner::Dynamic };
        let mut m = MigRecord::intent(owner, profile_id, &profile.name, start, profile.memory_slices);
        let gis = self.backend.gpu_instances(&gpu.info.uuid).unwrap_or_default();
        for gi in gis.iter().filter(|g| g.profile_id == profile_id && g.start == start) {
            let cis = self.backend.compute_instances(&gpu.info.uuid, gi.id).unwrap_or_default();
            if let Some(ci) = cis.into_iter().find(|c| c.uuid == uuid) {
                let caps = self.backend.mig_capability_minors(gpu.info.minor, gi.id, ci.id).ok();
                m.gi_id = Some(gi.id);
                m.ci_id = Some(ci.id);
                m.uuid = Some(ci.uuid);
                m.gi_cap_minor = caps.map(|c| c.0);
                m.ci_cap_minor = caps.map(|c| c.1);
            }
        }
        Some(m)
    }

    /// Instances on dynamic GPUs that no checkpoint entry explains, handled by the policy.
    fn sweep_orphans(&self) -> Result<Vec<Orphan>, PrepareError> {
        let cp = self.store.read().map_err(PrepareError::NodeCheckpoint)?;
        let mut orphans = Vec::new();
        for gpu in self.gpus.iter().filter(|g| g.mode == GpuMode::Dynamic) {
            let uuid = gpu.info.uuid.as_str();
            let Ok(_guard) = gpu.lock.lock(self.opts.lock_timeout) else { continue };
            let gis = match self.backend.gpu_instances(uuid) {
                Ok(gis) => gis,
                // Lost: nothing on it can be reached, or needs to be; the other GPUs are swept.
                Err(e) if matches!(e.code(), Some(NvmlCode::NotSupported | NvmlCode::GpuIsLost)) => continue,
                Err(e) => return Err(PrepareError::Discovery(e)),
            };
            for gi in gis {
                let explained = cp
                    .claims
                    .values()
                    .flat_map(|c| &c.devices)
                    .any(|d| d.gpu_uuid == uuid && d.mig.as_ref().is_some_and(|m| holds(m, &gi)));
                if explained {
                    continue;
                }
                let action = match self.opts.orphans {
                    OrphanPolicy::Keep => OrphanAction::Kept,
                    OrphanPolicy::Report => OrphanAction::Reported,
                    OrphanPolicy::Destroy => match destroy_gi(self.backend.as_ref(), uuid, gi.id, None) {
                        Ok(()) => {
                            self.step(Step::OrphanDestroyed);
                            OrphanAction::Destroyed
                        }
                        Err(e) => OrphanAction::DestroyFailed(e.to_string()),
                    },
                };
                orphans.push(Orphan {
                    gpu: uuid.to_string(),
                    gi_id: gi.id,
                    profile_id: gi.profile_id,
                    start: gi.start,
                    action,
                });
            }
        }
        Ok(orphans)
    }
}

/// After a reboot: the claim's instances are gone; keep the intent, drop the IDs.
fn forget_instances(c: &mut ClaimRecord) {
    c.needs_recreate = true;
    c.state = ClaimState::PrepareStarted;
    for m in c.devices.iter_mut().filter_map(|d| d.mig.as_mut()) {
        *m = m.forgotten();
    }
}
