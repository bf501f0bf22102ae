//! A claim's CDI spec, made from its checkpoint record: the devices, the mounts of its device
//! metadata files, the check that the host has the nodes it names, and the repair of spec and
//! metadata files on disk. Prepare, cleanup and recovery share it.

use super::error::nvml;
use super::{Engine, PrepareError};
use crate::cdi;
use crate::claims::ClaimRef;
use crate::state::ClaimRecord;

impl Engine {
    /// The CDI devices of a claim's spec, from what its record says was made. Reads NVML only for
    /// the nvidia-caps major.
    pub(super) fn spec_devices(&self, rec: &ClaimRecord) -> Result<Vec<cdi::CdiDevice>, PrepareError> {
        let claim = rec.claim();
        let mut caps_major = None;
        let mut out = Vec::with_capacity(rec.devices.len());
        for d in &rec.devices {
            let name = cdi::device_name(&rec.uid, &d.device);
            out.push(match &d.mig {
                None => cdi::gpu_device(name, d.gpu_minor, &d.gpu_uuid),
                Some(m) => {
                    let major = match caps_major {
                        Some(major) => major,
                        None => *caps_major.insert(nvml(&claim, &d.device, "read the nvidia-caps major", || {
                            self.backend.caps_major()
                        })?),
                    };
                    cdi::mig_device(
                        name,
                        d.gpu_minor,
                        m.uuid.as_deref().unwrap_or_default(),
                        m.gi_cap_minor.unwrap_or_default(),
                        m.ci_cap_minor.unwrap_or_default(),
                        major,
                    )
                }
            });
        }
        Ok(out)
    }

    /// Make a prepared claim's spec and metadata files on disk what its record says, rewriting
    /// deleted or changed ones; returns what they were before (the spec's state first).
    ///
    /// # Errors
    /// The spec cannot be written.
    pub(crate) fn repair_files(&self, rec: &ClaimRecord) -> Result<cdi::SpecState, PrepareError> {
        let claim = rec.claim();
        let metadata = self.ensure_metadata(rec)?;
        if metadata != cdi::SpecState::Intact {
            tracing::warn!(
                claim = %claim,
                metadata = metadata.as_str(),
                "the claim's device metadata was {} on disk; wrote it again",
                metadata.as_str()
            );
        }
        let devices = self.claim_spec(rec)?;
        let (_, state) = self
            .cdi
            .ensure(&rec.uid, &devices)
            .map_err(|source| PrepareError::Cdi { claim: Box::new(claim.clone()), source })?;
        if state != cdi::SpecState::Intact {
            tracing::warn!(
                claim = %claim,
                spec = state.as_str(),
                "the claim's CDI spec was {} on disk; wrote it again",
                state.as_str()
            );
        }
        Ok(if state == cdi::SpecState::Intact { metadata } else { state })
    }

    /// Fail now, not at container creation, if a host node `devices` name is missing
    /// (`--host-root`; not checked when `None`).
    pub(super) fn check_host_nodes(&self, claim: &ClaimRef, devices: &[cdi::CdiDevice]) -> Result<(), PrepareError> {
        let Some(root) = &self.opts.host_root else { return Ok(()) };
        cdi::host::check(root, devices)
            .map_err(|source| PrepareError::HostNode { claim: Box::new(claim.clone()), source })
    }

    /// The devices of the claim's CDI spec: [`Engine::spec_devices`], the first device of each
    /// request also mounting that request's metadata file.
    pub(super) fn claim_spec(&self, rec: &ClaimRecord) -> Result<Vec<cdi::CdiDevice>, PrepareError> {
        let mut devices = self.spec_devices(rec)?;
        let Some((claim, requests)) = self.metadata_of(rec) else { return Ok(devices) };
        let mounts = self
            .metadata
            .mounts(&claim, &requests)
            .map_err(|source| PrepareError::Cdi { claim: Box::new(rec.claim()), source })?;
        for m in mounts {
            let first =
                rec.devices.iter().position(|d| d.requests.iter().any(|r| r.split('/').next() == Some(&m.request)));
            if let Some(i) = first {
                devices[i] = cdi::with_mount(devices[i].clone(), &m.host_path, &m.container_path);
            }
        }
        Ok(devices)
    }
}
