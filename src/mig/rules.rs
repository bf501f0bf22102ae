//! NVML's rules for which GPU instances can exist together on one GPU (docs/facts/mig-nvml.md §0).
//!
//! This is the reference the simulator enforces and the counter model is proven against; it is
//! written from the rules as NVIDIA states them, independently of the counters.

use super::catalog::{GiProfile, GpuModel, MediaEngines};
use thiserror::Error;

/// A GPU instance by profile ID and placement start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Placed {
    pub profile_id: u32,
    pub start: u32,
}

/// Every placement NVML offers on `model`, profile by profile in catalog order.
pub fn every_placement(model: &GpuModel) -> Vec<Placed> {
    let profiles = model.profiles.iter();
    profiles.flat_map(|p| p.placements.iter().map(|&start| Placed { profile_id: p.id, start })).collect()
}

/// Why NVML would refuse a GPU instance.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refusal {
    /// NVML: NOT_SUPPORTED / INVALID_ARGUMENT.
    #[error("profile ID {id} does not exist on {model}; valid: {valid}")]
    UnknownProfile { id: u32, model: String, valid: String },
    /// NVML: INVALID_ARGUMENT.
    #[error("placement {start} is not valid for profile {profile}; valid starts: {valid}")]
    InvalidPlacement { profile: String, start: u32, valid: String },
    /// NVML: INSUFFICIENT_RESOURCES.
    #[error("{profile} at {start}:{size} overlaps memory slices already in use")]
    Overlap { profile: String, start: u32, size: u32 },
    /// NVML: INSUFFICIENT_RESOURCES.
    #[error("{profile} needs {need} compute slices but only {free} of {total} are free")]
    ComputeSlices { profile: String, need: u32, free: u32, total: u32 },
    /// NVML: INSUFFICIENT_RESOURCES.
    #[error("{profile} already has its maximum of {max} instances")]
    MaxInstances { profile: String, max: u32 },
    /// NVML: INSUFFICIENT_RESOURCES.
    #[error("{profile} conflicts with the media engines held by {holder}")]
    MediaEngines { profile: String, holder: String },
}

impl Refusal {
    /// True when NVML reports this as INSUFFICIENT_RESOURCES (the GPU is busy), false for a bad
    /// argument.
    pub fn is_insufficient_resources(&self) -> bool {
        !matches!(self, Self::UnknownProfile { .. } | Self::InvalidPlacement { .. })
    }
}

/// The profile of a placement, if the profile exists on the model and the start is one of its
/// placements.
pub fn check_placement(model: &GpuModel, p: Placed) -> Result<&GiProfile, Refusal> {
    let profile = model.profile(p.profile_id).ok_or_else(|| Refusal::UnknownProfile {
        id: p.profile_id,
        model: model.key.clone(),
        valid: model.profile_names(),
    })?;
    if !profile.placements.contains(&p.start) {
        return Err(Refusal::InvalidPlacement {
            profile: profile.name.clone(),
            start: p.start,
            valid: profile.placements_text(),
        });
    }
    Ok(profile)
}

/// Whether NVML would create `new` next to the instances in `existing` (assumed valid together).
pub fn admits(model: &GpuModel, existing: &[Placed], new: Placed) -> Result<(), Refusal> {
    let profile = check_placement(model, new)?;
    let (start, end) = (new.start, new.start + profile.memory_slices);
    let mut compute_used = 0;
    let mut same_profile = 0;
    for e in existing {
        let other = check_placement(model, *e)?;
        let (s, t) = (e.start, e.start + other.memory_slices);
        if start < t && s < end {
            return Err(Refusal::Overlap { profile: profile.name.clone(), start, size: profile.memory_slices });
        }
        compute_used += other.compute_slices;
        if other.id == profile.id {
            same_profile += 1;
        }
        if media_conflict(profile.media, other.media) {
            return Err(Refusal::MediaEngines { profile: profile.name.clone(), holder: other.name.clone() });
        }
    }
    if compute_used + profile.compute_slices > model.compute_slices {
        return Err(Refusal::ComputeSlices {
            profile: profile.name.clone(),
            need: profile.compute_slices,
            free: model.compute_slices.saturating_sub(compute_used),
            total: model.compute_slices,
        });
    }
    if same_profile >= profile.max_instances {
        return Err(Refusal::MaxInstances { profile: profile.name.clone(), max: profile.max_instances });
    }
    Ok(())
}

/// Whether NVML would hold every instance of `set` at once.
pub fn admits_set(model: &GpuModel, set: &[Placed]) -> Result<(), Refusal> {
    for (i, p) in set.iter().enumerate() {
        admits(model, &set[..i], *p)?;
    }
    Ok(())
}

/// Media-engine exclusivity: one `+me`/`+me.all` per GPU, and `+me.all` allows only `-me` beside it.
fn media_conflict(a: MediaEngines, b: MediaEngines) -> bool {
    use MediaEngines::*;
    matches!((a, b), (Me | AllMe, Me | AllMe) | (AllMe, Standard) | (Standard, AllMe))
}
