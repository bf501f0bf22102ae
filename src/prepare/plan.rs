//! Turning a claim's allocation into a plan: which GPU, which partition, who owns it.
//!
//! Pure validation, before anything is written or created, so a bad claim fails alone and leaves
//! nothing behind. Placement comes only from the allocated device name; migdra chooses nothing.

use super::{GpuEntry, PrepareError};
use crate::claims::{AllocationResult, ClaimRef};
use crate::mig::catalog::GiProfile;
use crate::mig::devices::GpuMode;
use crate::mig::naming::{DeviceName, PublishedName, profile_slug};
use crate::mig::rules::{self, Placed};
use crate::state::MigOwner;

/// One device of a claim, resolved against this node's GPUs.
#[derive(Debug, Clone)]
pub struct PlannedDevice<'a> {
    /// Every request of the claim that got this device.
    pub requests: Vec<String>,
    pub device: String,
    /// The Slurm index the name carries in front (`--device-names slurm`); checked against the
    /// GPU's or instance's actual index before a new prepare ([`check_prefix`]).
    pub slurm_prefix: Option<u32>,
    pub gpu: &'a GpuEntry,
    /// `None` for a whole GPU.
    pub mig: Option<PlannedMig>,
}

#[derive(Debug, Clone)]
pub struct PlannedMig {
    pub owner: MigOwner,
    pub profile: GiProfile,
    pub start: u32,
}

/// A device allocated for admin access: a GPU of this node to see whole, nothing to create.
#[derive(Debug, Clone)]
pub struct AdminDevice<'a> {
    pub requests: Vec<String>,
    pub device: String,
    pub gpu: &'a GpuEntry,
}

/// Whether the claim's results of our driver are for admin access (`adminAccess: true`). The
/// API server admits such a claim only in a namespace labelled for it; migdra takes the
/// allocation as it is and does not look at the namespace.
///
/// # Errors
/// Some results are for admin access and some not: one prepare cannot both create instances and
/// only watch them, so the claim is refused as a whole.
pub fn is_admin(claim: &ClaimRef, results: &[AllocationResult], driver: &str) -> Result<bool, PrepareError> {
    let ours = || results.iter().filter(|r| r.driver == driver);
    let admin = |r: &&AllocationResult| r.admin_access == Some(true);
    match (ours().any(|r| admin(&r)), ours().find(|r| !admin(r))) {
        (true, Some(plain)) => Err(PrepareError::bad(
            claim,
            &plain.device,
            format!(
                "request {:?} is not for admin access but others of the claim are; put \
                 admin-access requests in a claim of their own",
                plain.request
            ),
        )),
        (admin, _) => Ok(admin),
    }
}

/// Resolve every admin-access result of our driver to its GPU: the name must decode and name a
/// GPU of this node, in any mode; the partition it names is neither checked nor made.
///
/// # Errors
/// As [`plan`], for names and pools.
pub fn plan_admin<'a>(
    claim: &ClaimRef,
    results: &[AllocationResult],
    driver: &str,
    pool: &str,
    gpus: &'a [GpuEntry],
) -> Result<Vec<AdminDevice<'a>>, PrepareError> {
    let mut planned: Vec<AdminDevice<'a>> = Vec::new();
    for r in ours(claim, results, driver, pool)? {
        if let Some(p) = planned.iter_mut().find(|p| p.device == r.device) {
            p.requests.push(r.request.clone());
            continue;
        }
        let (_, gpu) = gpu_of(claim, r, gpus)?;
        planned.push(AdminDevice { requests: vec![r.request.clone()], device: r.device.clone(), gpu });
    }
    Ok(planned)
}

/// Resolve every result of our driver; results of other drivers belong to other plugins.
///
/// # Errors
/// The first device that is not ours, malformed, not on this node, or not a valid partition.
pub fn plan<'a>(
    claim: &ClaimRef,
    results: &[AllocationResult],
    driver: &str,
    pool: &str,
    gpus: &'a [GpuEntry],
) -> Result<Vec<PlannedDevice<'a>>, PrepareError> {
    let mut planned: Vec<PlannedDevice<'a>> = Vec::new();
    for r in ours(claim, results, driver, pool)? {
        if let Some(p) = planned.iter_mut().find(|p| p.device == r.device) {
            p.requests.push(r.request.clone());
            continue;
        }
        planned.push(resolve(claim, r, gpus)?);
    }
    Ok(planned)
}

/// The results of our driver, each checked to be in this node's pool.
fn ours<'r>(
    claim: &ClaimRef,
    results: &'r [AllocationResult],
    driver: &str,
    pool: &str,
) -> Result<Vec<&'r AllocationResult>, PrepareError> {
    let ours: Vec<&AllocationResult> = results.iter().filter(|r| r.driver == driver).collect();
    if ours.is_empty() {
        let mut drivers: Vec<&str> = results.iter().map(|r| r.driver.as_str()).collect();
        drivers.dedup();
        let seen = if drivers.is_empty() { "none".to_string() } else { drivers.join(", ") };
        return Err(PrepareError::bad(
            claim,
            "-",
            format!("no device of driver {driver} is allocated (drivers: {seen})"),
        ));
    }
    if let Some(r) = ours.iter().find(|r| r.pool != pool) {
        return Err(PrepareError::bad(
            claim,
            &r.device,
            format!("it is in pool {:?}, but this node's pool is {pool:?}", r.pool),
        ));
    }
    Ok(ours)
}

/// The device's published name and the GPU of this node it is on.
fn gpu_of<'a>(
    claim: &ClaimRef,
    r: &AllocationResult,
    gpus: &'a [GpuEntry],
) -> Result<(PublishedName, &'a GpuEntry), PrepareError> {
    let bad = |reason: String| PrepareError::bad(claim, &r.device, reason);
    let published = PublishedName::parse(&r.device).map_err(|e| bad(e.reason.to_string()))?;
    let minor = published.device.minor();
    let gpu = gpus.iter().find(|g| g.info.minor == minor).ok_or_else(|| {
        let minors: Vec<String> = gpus.iter().map(|g| g.info.minor.to_string()).collect();
        bad(format!("no GPU with minor {minor} on this node (minors: {})", minors.join(", ")))
    })?;
    Ok((published, gpu))
}

fn resolve<'a>(
    claim: &ClaimRef,
    r: &AllocationResult,
    gpus: &'a [GpuEntry],
) -> Result<PlannedDevice<'a>, PrepareError> {
    let bad = |reason: String| PrepareError::bad(claim, &r.device, reason);
    let (published, gpu) = gpu_of(claim, r, gpus)?;
    let name = &published.device;
    let mig = match name {
        DeviceName::Gpu { .. } => {
            if gpu.mode != GpuMode::Full {
                return Err(bad(format!(
                    "GPU {} has MIG enabled; only its MIG devices can be prepared",
                    gpu.info.minor
                )));
            }
            None
        }
        DeviceName::Mig { profile_slug: slug, profile_id, start, .. } => {
            let owner = match gpu.mode {
                GpuMode::Full => return Err(bad(format!("GPU {} has MIG disabled", gpu.info.minor))),
                GpuMode::Dynamic if published.slurm_index.is_some() => {
                    return Err(bad(format!(
                        "GPU {} is a dynamic-MIG GPU, whose partitions are never published with a \
                         Slurm index in front; the ResourceSlice it was allocated from is stale",
                        gpu.info.minor
                    )));
                }
                GpuMode::Dynamic => MigOwner::Dynamic,
                GpuMode::Static => MigOwner::Static,
            };
            let profile = rules::check_placement(&gpu.model, Placed { profile_id: *profile_id, start: *start })
                .map_err(|e| bad(e.to_string()))?
                .clone();
            if profile_slug(&profile.name) != *slug {
                return Err(bad(format!("profile ID {profile_id} is {} on this GPU, not {slug:?}", profile.name)));
            }
            Some(PlannedMig { owner, profile, start: *start })
        }
    };
    Ok(PlannedDevice {
        requests: vec![r.request.clone()],
        device: r.device.clone(),
        slurm_prefix: published.slurm_index,
        gpu,
        mig,
    })
}

/// Whether a name's Slurm index prefix matches the `actual` index of what it names (`what`, e.g.
/// `GPU minor 1`). A mismatch means the slice the device was allocated from predates a change of
/// Slurm's order, so slurm-bridge accounted the allocation to another GPU: refused, not guessed.
///
/// # Errors
/// The reason, in one line.
pub fn check_prefix(prefix: Option<u32>, actual: Option<u32>, what: &str) -> Result<(), String> {
    let Some(prefix) = prefix else { return Ok(()) };
    match actual {
        Some(actual) if actual == prefix => Ok(()),
        Some(actual) => Err(format!(
            "its name carries Slurm index {prefix}, but {what} has Slurm index {actual}; the \
             ResourceSlice it was allocated from is stale, so slurm-bridge may have accounted it \
             to another device: delete and recreate the claim"
        )),
        None => Err(format!(
            "its name carries Slurm index {prefix}, but Slurm lists no index for {what}; the \
             ResourceSlice it was allocated from is stale: delete and recreate the claim"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::check_prefix;

    #[test]
    fn prefixes_must_match_the_actual_index() {
        assert_eq!(check_prefix(None, Some(3), "GPU minor 1"), Ok(()));
        assert_eq!(check_prefix(None, None, "GPU minor 1"), Ok(()));
        assert_eq!(check_prefix(Some(3), Some(3), "GPU minor 1"), Ok(()));
        let wrong = check_prefix(Some(3), Some(5), "GPU minor 1").unwrap_err();
        assert!(wrong.starts_with("its name carries Slurm index 3, but GPU minor 1 has Slurm index 5;"), "{wrong}");
        let none = check_prefix(Some(3), None, "GPU minor 1").unwrap_err();
        assert!(none.contains("Slurm lists no index for GPU minor 1"), "{none}");
        assert!(!wrong.contains('\n') && !none.contains('\n'));
    }
}
