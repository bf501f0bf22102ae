//! Each prepared claim's device metadata files (KEP-5304, [`crate::cdi::metadata`]): what goes in
//! them, from the claim's record and the attributes its devices are published with. Written before
//! the spec that mounts them ([`super::spec`]), removed with it.

use super::{Engine, PrepareError};
use crate::cdi::SpecState;
use crate::cdi::metadata::{ClaimMeta, MetaDevice, RequestMeta};
use crate::claims::ClaimRef;
use crate::mig::devices::{AttributeValue, PCI_BUS_ID, full_gpu_device, mig_device};
use crate::state::{ClaimRecord, DeviceRecord};
use std::collections::BTreeMap;

impl Engine {
    /// The claim and its requests as the metadata files describe them; `None` for a claim whose
    /// namespace or name is unknown (one rebuilt from CDI specs alone) or whose devices name no
    /// request: no container can ask for its files.
    pub(super) fn metadata_of<'r>(&self, rec: &'r ClaimRecord) -> Option<(ClaimMeta<'r>, Vec<RequestMeta>)> {
        if rec.namespace.is_empty() || rec.name.is_empty() {
            return None;
        }
        let mut requests: Vec<RequestMeta> = Vec::new();
        for d in &rec.devices {
            let device = MetaDevice { pool: d.pool.clone(), name: d.device.clone(), attributes: self.attributes(d) };
            for r in &d.requests {
                let base = r.split('/').next().unwrap_or_default();
                match requests.iter_mut().find(|m| m.base() == base) {
                    Some(m) => m.devices.push(device.clone()),
                    None => requests.push(RequestMeta { request: r.clone(), devices: vec![device.clone()] }),
                }
            }
        }
        let claim = ClaimMeta {
            uid: &rec.uid,
            namespace: &rec.namespace,
            name: &rec.name,
            pod_claim_name: rec.pod_claim_name.as_deref(),
        };
        (!requests.is_empty()).then_some((claim, requests))
    }

    /// What the slice says about the device, with the MIG UUID once the instance exists.
    fn attributes(&self, d: &DeviceRecord) -> BTreeMap<String, AttributeValue> {
        let Some(gpu) = self.gpu(&d.gpu_uuid) else { return recorded_attributes(d) };
        let id = gpu.identity();
        let Some(m) = &d.mig else { return full_gpu_device(&gpu.model, &id, gpu.mode, None).attributes };
        let Some(profile) = gpu.model.profile(m.profile_id) else { return recorded_attributes(d) };
        let mut a = mig_device(&gpu.model, &id, gpu.mode, profile, m.start, m.uuid.as_deref(), None).attributes;
        if let Some(i) = m.gi_id.zip(m.ci_id).and_then(|(gi, ci)| gpu.slurm.mig_index(gi, ci)) {
            a.insert("slurmMigIndex".into(), AttributeValue::Int(i.into()));
        }
        a
    }

    /// Make the claim's metadata files on disk what its record says; what they were before.
    ///
    /// # Errors
    /// A file cannot be written: the error names its path.
    pub(super) fn ensure_metadata(&self, rec: &ClaimRecord) -> Result<SpecState, PrepareError> {
        let Some((claim, requests)) = self.metadata_of(rec) else { return Ok(SpecState::Intact) };
        let cdi = |source| PrepareError::Cdi { claim: Box::new(rec.claim()), source };
        self.metadata.ensure(&claim, &requests).map(|(_, state)| state).map_err(cdi)
    }

    /// What the claim's metadata files are on disk. Reads only.
    pub(super) fn check_metadata(&self, rec: &ClaimRecord) -> Result<SpecState, PrepareError> {
        let Some((claim, requests)) = self.metadata_of(rec) else { return Ok(SpecState::Intact) };
        self.metadata
            .check(&claim, &requests)
            .map_err(|source| PrepareError::Cdi { claim: Box::new(rec.claim()), source })
    }

    /// Remove a claim's metadata files, unless another claim of the same namespace and name (one
    /// deleted and re-created while the old was still prepared) holds them now.
    ///
    /// # Errors
    /// The directory cannot be removed, or the checkpoint read.
    pub(super) fn remove_metadata(&self, claim: &ClaimRef) -> Result<(), PrepareError> {
        if claim.namespace.is_empty() || claim.name.is_empty() {
            return Ok(());
        }
        let cp =
            self.store.read().map_err(|source| PrepareError::Checkpoint { claim: Box::new(claim.clone()), source })?;
        if cp.claims.values().any(|c| c.uid != claim.uid && c.namespace == claim.namespace && c.name == claim.name) {
            return Ok(());
        }
        self.metadata
            .remove(&claim.namespace, &claim.name)
            .map_err(|source| PrepareError::Cdi { claim: Box::new(claim.clone()), source })
    }

    /// Remove the metadata of every claim the checkpoint does not hold, under the checkpoint lock
    /// (a prepare records its claim there before it writes its files); the `namespace/name`s
    /// removed.
    pub(super) fn remove_stale_metadata(&self) -> Vec<String> {
        let Ok(found) = self.metadata.claims() else { return Vec::new() };
        if found.is_empty() {
            return Vec::new();
        }
        let swept = self.store.update(&self.boot_id, |cp| {
            let held = |ns: &str, name: &str| cp.claims.values().any(|c| c.namespace == ns && c.name == name);
            let stale = found.iter().filter(|(ns, name)| !held(ns, name));
            let removed = stale.filter(|(ns, name)| self.metadata.remove(ns, name).is_ok());
            Ok::<_, std::convert::Infallible>(removed.map(|(ns, name)| format!("{ns}/{name}")).collect())
        });
        match swept {
            Ok(Ok(removed)) => removed,
            Ok(Err(never)) => match never {},
            Err(_) => Vec::new(),
        }
    }
}

/// For a device whose GPU is gone from the node: what its record says.
fn recorded_attributes(d: &DeviceRecord) -> BTreeMap<String, AttributeValue> {
    use AttributeValue::{Int, String};
    let mut a = BTreeMap::from([
        ("index".to_string(), Int(d.gpu_index.into())),
        ("minor".to_string(), Int(d.gpu_minor.into())),
        (PCI_BUS_ID.to_string(), String(crate::pci::standard(&d.pci_bus_id))),
    ]);
    match &d.mig {
        None => {
            a.insert("type".into(), String("gpu".into()));
            a.insert("uuid".into(), String(d.gpu_uuid.clone()));
        }
        Some(m) => {
            a.insert("type".into(), String("mig".into()));
            a.insert("parentUUID".into(), String(d.gpu_uuid.clone()));
            a.insert("profile".into(), String(m.profile.clone()));
            a.insert("profileId".into(), Int(m.profile_id.into()));
            a.insert("placementStart".into(), Int(m.start.into()));
            a.insert("placementSize".into(), Int(m.size.into()));
            if let Some(u) = &m.uuid {
                a.insert("uuid".into(), String(u.clone()));
            }
        }
    }
    a
}
