//! `migdra cleanup`: what the checkpoint, the CDI directory and the hardware disagree on, found on
//! a live node next to the running daemon, and fixed only when asked.
//!
//! - **Orphans**: MIG instances on dynamic GPUs that no claim in the checkpoint explains; destroyed
//!   (CI, then GI). Instances on static GPUs are an administrator's and never appear here.
//! - **Stale CDI specs**: specs of this driver whose claim the checkpoint does not hold; removed.
//! - **Stale device metadata**: metadata files (KEP-5304) of claims the checkpoint does not hold;
//!   removed.
//! - **Broken CDI specs**: prepared claims whose spec or metadata file was deleted or changed on
//!   disk, so their containers could not start (`unresolvable CDI devices`); written again.
//! - **Lost claims**: prepared claims whose instance (or GPU) is gone; their instance IDs are
//!   forgotten and they are marked for re-creation, as after a reboot, so the kubelet's next
//!   prepare makes them again and an unprepare succeeds.
//!
//! Every change is re-checked under the lock the daemon takes for the same change (the GPU's lock
//! for instances, the checkpoint lock for specs and claims), so a claim the daemon is preparing
//! right now is never touched. A dry run takes no lock and changes nothing.

use super::instances::{destroy_gi, holds};
use super::{Engine, Step};
use crate::cdi;
use crate::cdi::CdiError;
use crate::gpu::GpuError;
use crate::gpu::{GpuInstance, NvmlCode};
use crate::mig::devices::GpuMode;
use crate::mig::naming::DeviceName;
use crate::state::StateError;
use crate::state::{Checkpoint, ClaimRecord, ClaimState};
use serde::Serialize;
use std::collections::BTreeMap;

/// Why cleanup could not look at all. A finding that cannot be fixed is not an error: its
/// [`Outcome`] says `failed`.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error(
        "the node rebooted since the checkpoint was written; start migdra serve (its recovery \
         re-creates the claims), then run cleanup"
    )]
    Rebooted,
    #[error("failed to read the checkpoint: {0}")]
    Checkpoint(#[source] StateError),
    #[error("failed to list MIG instances: {0}")]
    Gpu(#[source] GpuError),
    #[error("failed to list CDI specs: {0}")]
    Cdi(#[source] CdiError),
}

/// What cleanup found, and what it did or would do with each finding.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CleanupReport {
    pub dry_run: bool,
    pub orphans: Vec<OrphanInstance>,
    pub stale_cdi_specs: Vec<StaleSpec>,
    pub stale_metadata: Vec<StaleMetadata>,
    pub broken_cdi_specs: Vec<BrokenSpec>,
    pub lost_claims: Vec<LostClaim>,
}

impl CleanupReport {
    /// Whether any change that was tried failed.
    pub fn failed(&self) -> bool {
        self.orphans
            .iter()
            .map(|o| &o.outcome)
            .chain(self.stale_cdi_specs.iter().map(|s| &s.outcome))
            .chain(self.stale_metadata.iter().map(|s| &s.outcome))
            .chain(self.broken_cdi_specs.iter().map(|s| &s.outcome))
            .chain(self.lost_claims.iter().map(|c| &c.outcome))
            .any(|o| o.error.is_some())
    }

    /// Whether there is nothing to clean up.
    pub fn is_empty(&self) -> bool {
        self.orphans.is_empty()
            && self.stale_cdi_specs.is_empty()
            && self.stale_metadata.is_empty()
            && self.broken_cdi_specs.is_empty()
            && self.lost_claims.is_empty()
    }
}

/// What happened to one finding: `action` says it (`would destroy`, `destroyed`, `skipped`, …).
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub action: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Outcome {
    fn planned(dry_run: bool, would: &str, did: &str) -> Self {
        Self { action: if dry_run { would } else { did }.to_string(), error: None }
    }

    fn failed(error: impl ToString) -> Self {
        Self { action: "failed".into(), error: Some(error.to_string()) }
    }

    fn skipped(why: &str) -> Self {
        Self { action: format!("skipped: {why}"), error: None }
    }
}

/// A MIG instance no claim explains.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OrphanInstance {
    pub gpu_uuid: String,
    pub gpu_index: u32,
    /// The device name the partition has in our slices.
    pub device: String,
    pub profile: String,
    pub gpu_instance_id: u32,
    pub placement_start: u32,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// A CDI spec whose claim the checkpoint does not hold.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StaleSpec {
    pub claim_uid: String,
    pub path: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Device metadata files of a claim the checkpoint does not hold.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StaleMetadata {
    pub namespace: String,
    pub name: String,
    pub path: String,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// A prepared claim whose CDI spec or metadata is not what migdra wrote.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BrokenSpec {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub path: String,
    /// `missing` or `altered` (the spec), `metadata missing` or `metadata altered`.
    pub problem: &'static str,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// A prepared claim whose hardware is gone.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LostClaim {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// Each missing device, with what is missing.
    pub missing: Vec<String>,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// A finding of the cleanup about one claim: what `act_on_unchanged` needs of it.
trait Entry {
    fn uid(&self) -> &str;
    fn outcome(&mut self) -> &mut Outcome;
}

impl Entry for BrokenSpec {
    fn uid(&self) -> &str {
        &self.uid
    }
    fn outcome(&mut self) -> &mut Outcome {
        &mut self.outcome
    }
}

impl Entry for LostClaim {
    fn uid(&self) -> &str {
        &self.uid
    }
    fn outcome(&mut self) -> &mut Outcome {
        &mut self.outcome
    }
}

impl Engine {
    /// Find (and unless `dry_run`, fix) orphans, stale CDI specs and lost claims.
    ///
    /// # Errors
    /// The checkpoint or the GPUs cannot be read, or (not a dry run) the node rebooted since the
    /// checkpoint was written: then `migdra serve`'s recovery must run first.
    pub fn cleanup(&self, dry_run: bool) -> Result<CleanupReport, CleanupError> {
        let cp = self.store.read().map_err(CleanupError::Checkpoint)?;
        if !dry_run && !cp.boot_id.is_empty() && cp.boot_id != self.boot_id {
            return Err(CleanupError::Rebooted);
        }
        let mut report = CleanupReport { dry_run, ..Default::default() };
        let mut instances: BTreeMap<String, Vec<GpuInstance>> = BTreeMap::new();
        for gpu in self.gpus.iter().filter(|g| g.info.mig_enabled) {
            match self.backend.gpu_instances(&gpu.info.uuid) {
                Ok(gis) => {
                    instances.insert(gpu.info.uuid.clone(), gis);
                }
                Err(e) if e.code() == Some(NvmlCode::NotSupported) => {}
                Err(e) => return Err(CleanupError::Gpu(e)),
            }
        }
        report.orphans = self.clean_orphans(&cp, &instances, dry_run)?;
        report.stale_cdi_specs = self.clean_specs(&cp, dry_run)?;
        report.stale_metadata = self.clean_metadata(&cp, dry_run)?;
        report.lost_claims = self.clean_lost(&cp, &instances, dry_run);
        let lost: Vec<&str> = report.lost_claims.iter().map(|l| l.uid.as_str()).collect();
        report.broken_cdi_specs = self.clean_broken(&cp, &lost, dry_run);
        Ok(report)
    }

    fn clean_orphans(
        &self,
        cp: &Checkpoint,
        instances: &BTreeMap<String, Vec<GpuInstance>>,
        dry_run: bool,
    ) -> Result<Vec<OrphanInstance>, CleanupError> {
        let mut out = Vec::new();
        for gpu in self.gpus.iter().filter(|g| g.mode == GpuMode::Dynamic) {
            let uuid = gpu.info.uuid.as_str();
            let explained = |cp: &Checkpoint, gi: &GpuInstance| {
                cp.claims
                    .values()
                    .flat_map(|c| &c.devices)
                    .any(|d| d.gpu_uuid == uuid && d.mig.as_ref().is_some_and(|m| holds(m, gi)))
            };
            let found: Vec<&GpuInstance> =
                instances.get(uuid).into_iter().flatten().filter(|gi| !explained(cp, gi)).collect();
            if found.is_empty() {
                continue;
            }
            // Not a dry run: under the GPU's lock, look again; a prepare may have recorded one since,
            // and a GI ID may have been destroyed and reused.
            let guard = if dry_run { None } else { Some(gpu.lock.lock(self.opts.lock_timeout)) };
            let now = match &guard {
                Some(Ok(_)) => Some((
                    self.store.read().map_err(CleanupError::Checkpoint)?,
                    self.backend.gpu_instances(uuid).map_err(CleanupError::Gpu)?,
                )),
                _ => None,
            };
            for gi in found {
                let profile = gpu
                    .model
                    .profile(gi.profile_id)
                    .map_or_else(|| format!("id {}", gi.profile_id), |p| p.name.clone());
                let outcome = match (&guard, &now) {
                    (None, _) => Outcome::planned(true, "would destroy", ""),
                    (Some(Err(e)), _) => Outcome::failed(format!("GPU lock: {e}")),
                    (Some(Ok(_)), Some((now, _))) if explained(now, gi) => {
                        Outcome::skipped("a claim took it meanwhile")
                    }
                    (Some(Ok(_)), Some((_, gis))) if !gis.contains(gi) => Outcome::skipped("it is gone already"),
                    (Some(Ok(_)), _) => match destroy_gi(self.backend.as_ref(), uuid, gi.id, None) {
                        Ok(()) => {
                            self.step(Step::OrphanDestroyed);
                            Outcome::planned(false, "", "destroyed")
                        }
                        Err(e) => Outcome::failed(e),
                    },
                };
                out.push(OrphanInstance {
                    gpu_uuid: uuid.to_string(),
                    gpu_index: gpu.info.index,
                    device: DeviceName::mig(gpu.info.minor, &profile, gi.profile_id, gi.start).to_string(),
                    profile,
                    gpu_instance_id: gi.id,
                    placement_start: gi.start,
                    outcome,
                });
            }
        }
        Ok(out)
    }

    fn clean_specs(&self, cp: &Checkpoint, dry_run: bool) -> Result<Vec<StaleSpec>, CleanupError> {
        let (specs, _unreadable) = self.cdi.list().map_err(CleanupError::Cdi)?;
        let mut out: Vec<StaleSpec> = specs
            .into_iter()
            .filter(|(uid, _)| !cp.holds(uid))
            .map(|(uid, _)| StaleSpec {
                path: self.cdi.spec_path(&uid).map(|p| p.display().to_string()).unwrap_or_default(),
                claim_uid: uid,
                outcome: Outcome::planned(true, "would remove", ""),
            })
            .collect();
        // Under the checkpoint lock: a prepare records its claim there before writing its spec.
        self.remove_unless_held(
            dry_run,
            &mut out,
            |s| &mut s.outcome,
            |now, s| now.holds(&s.claim_uid),
            |s| self.cdi.remove(&s.claim_uid),
        );
        Ok(out)
    }

    /// Unless `dry_run`: remove each stale finding under the checkpoint lock, unless a claim now
    /// holds it, and set its outcome.
    fn remove_unless_held<T>(
        &self,
        dry_run: bool,
        found: &mut [T],
        outcome: impl Fn(&mut T) -> &mut Outcome,
        held: impl Fn(&Checkpoint, &T) -> bool,
        remove: impl Fn(&T) -> Result<(), CdiError>,
    ) {
        if dry_run || found.is_empty() {
            return;
        }
        let done = self.store.update(&self.boot_id, |now| {
            for f in found.iter_mut() {
                let o = if held(now, f) {
                    Outcome::skipped("its claim was prepared meanwhile")
                } else {
                    match remove(f) {
                        Ok(()) => Outcome::planned(false, "", "removed"),
                        Err(e) => Outcome::failed(e),
                    }
                };
                *outcome(f) = o;
            }
            Ok::<_, std::convert::Infallible>(())
        });
        if let Err(e) = done {
            for f in found.iter_mut() {
                *outcome(f) = Outcome::failed(format!("checkpoint: {e}"));
            }
        }
    }

    fn clean_metadata(&self, cp: &Checkpoint, dry_run: bool) -> Result<Vec<StaleMetadata>, CleanupError> {
        let held =
            |cp: &Checkpoint, ns: &str, name: &str| cp.claims.values().any(|c| c.namespace == ns && c.name == name);
        let found = self.metadata.claims().map_err(CleanupError::Cdi)?;
        let mut out: Vec<StaleMetadata> = found
            .into_iter()
            .filter(|(ns, name)| !held(cp, ns, name))
            .map(|(ns, name)| StaleMetadata {
                path: self.metadata.claim_dir(&ns, &name).map(|p| p.display().to_string()).unwrap_or_default(),
                namespace: ns,
                name,
                outcome: Outcome::planned(true, "would remove", ""),
            })
            .collect();
        // Under the checkpoint lock: a prepare records its claim there before writing its files.
        self.remove_unless_held(
            dry_run,
            &mut out,
            |s| &mut s.outcome,
            |now, s| held(now, &s.namespace, &s.name),
            |s| self.metadata.remove(&s.namespace, &s.name),
        );
        Ok(out)
    }

    /// Prepared claims whose spec or metadata is missing or changed; a lost claim is left to its
    /// re-creation.
    fn clean_broken(&self, cp: &Checkpoint, lost: &[&str], dry_run: bool) -> Vec<BrokenSpec> {
        let mut out = Vec::new();
        for c in cp.claims.values() {
            if c.state != ClaimState::PrepareCompleted || c.needs_recreate || lost.contains(&c.uid.as_str()) {
                continue;
            }
            let spec = self.claim_spec(c).and_then(|d| {
                self.cdi
                    .check(&c.uid, &d)
                    .map_err(|source| super::PrepareError::Cdi { claim: Box::new(c.claim()), source })
            });
            let state = match spec {
                Ok(cdi::SpecState::Intact) => self.check_metadata(c).map(|m| match m {
                    cdi::SpecState::Intact => None,
                    cdi::SpecState::Missing => Some("metadata missing"),
                    cdi::SpecState::Altered => Some("metadata altered"),
                }),
                Ok(state) => Ok(Some(state.as_str())),
                Err(e) => Err(e),
            };
            let problem = match state {
                Ok(None) => continue,
                Ok(Some(problem)) => problem,
                Err(e) => {
                    out.push(self.broken(c, "unknown", Outcome::failed(e)));
                    continue;
                }
            };
            out.push(self.broken(c, problem, Outcome::planned(true, "would write it again", "")));
        }
        if dry_run || out.is_empty() {
            return out;
        }
        // An unprepare marks its claim in the checkpoint before it removes the spec.
        self.act_on_unchanged(cp, &mut out, |c| match self.repair_files(c) {
            Ok(_) => Outcome::planned(false, "", "written again"),
            Err(e) => Outcome::failed(e),
        });
        out
    }

    fn broken(&self, c: &ClaimRecord, problem: &'static str, outcome: Outcome) -> BrokenSpec {
        BrokenSpec {
            uid: c.uid.clone(),
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            path: self.cdi.spec_path(&c.uid).map(|p| p.display().to_string()).unwrap_or_default(),
            problem,
            outcome,
        }
    }

    /// Act on each entry not already failed, under the checkpoint lock and only while its claim is
    /// still the record `cp` holds (else the daemon changed it meanwhile and it is skipped); a
    /// checkpoint that cannot be written fails them all.
    fn act_on_unchanged<E: Entry>(
        &self,
        cp: &Checkpoint,
        out: &mut [E],
        mut act: impl FnMut(&mut ClaimRecord) -> Outcome,
    ) {
        let done = self.store.update(&self.boot_id, |now| {
            for e in out.iter_mut() {
                if e.outcome().error.is_some() {
                    continue;
                }
                let outcome = match now.claims.get_mut(e.uid()) {
                    Some(c) if Some(&*c) == cp.claims.get(e.uid()) => act(c),
                    _ => Outcome::skipped("the daemon changed the claim meanwhile"),
                };
                *e.outcome() = outcome;
            }
            Ok::<_, std::convert::Infallible>(())
        });
        if let Err(e) = done {
            for x in out.iter_mut() {
                *x.outcome() = Outcome::failed(format!("checkpoint: {e}"));
            }
        }
    }

    fn clean_lost(
        &self,
        cp: &Checkpoint,
        instances: &BTreeMap<String, Vec<GpuInstance>>,
        dry_run: bool,
    ) -> Vec<LostClaim> {
        let mut out: Vec<LostClaim> = cp
            .claims
            .values()
            .filter(|c| c.state == ClaimState::PrepareCompleted && !c.needs_recreate)
            .filter_map(|c| {
                let missing = self.missing(c, instances);
                (!missing.is_empty()).then(|| LostClaim {
                    uid: c.uid.clone(),
                    namespace: c.namespace.clone(),
                    name: c.name.clone(),
                    missing,
                    outcome: Outcome::planned(true, "would mark for re-creation", ""),
                })
            })
            .collect();
        if dry_run || out.is_empty() {
            return out;
        }
        self.act_on_unchanged(cp, &mut out, |c| {
            c.needs_recreate = true;
            c.state = ClaimState::PrepareStarted;
            for m in c.devices.iter_mut().filter_map(|d| d.mig.as_mut()) {
                *m = m.forgotten();
            }
            Outcome::planned(false, "", "marked for re-creation")
        });
        out
    }

    /// The devices of a prepared claim whose GPU or instance is gone, each with what is missing.
    fn missing(&self, c: &ClaimRecord, instances: &BTreeMap<String, Vec<GpuInstance>>) -> Vec<String> {
        let mut missing = Vec::new();
        for d in &c.devices {
            let Some(gpu) = self.gpu(&d.gpu_uuid) else {
                missing.push(format!("{}: GPU {} is gone", d.device, d.gpu_uuid));
                continue;
            };
            let Some(m) = &d.mig else { continue };
            if !gpu.info.mig_enabled {
                missing.push(format!("{}: MIG mode is off on GPU {}", d.device, gpu.info.index));
                continue;
            }
            let Some(gis) = instances.get(&d.gpu_uuid) else { continue };
            if !gis.iter().any(|gi| holds(m, gi)) {
                let id = m.gi_id.map_or_else(String::new, |id| format!(" (GI {id})"));
                missing.push(format!("{}: the {} instance at {}{id} is gone", d.device, m.profile, m.start));
            }
        }
        missing
    }
}
