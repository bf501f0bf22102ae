//! Each GPU's health as the engine's backend reads it: the GPU's own and each GPU instance's.
//! The publisher taints by it and the metrics endpoint reports it, so it lives with the engine,
//! not with either.

use super::Engine;
use crate::gpu::GpuError;
use crate::mig::taints::{Cause, GpuHealth};

/// What a backend's reason says, as a taint cause: an XID, or else a lost GPU (the only other
/// reason either backend gives; NVML gives none for a GPU that stopped answering).
fn cause(reason: Option<String>) -> Cause {
    reason.as_deref().and_then(crate::gpu::xid::from_reason).map_or(Cause::Lost, Cause::Xid)
}

/// Each engine GPU's health, in engine order: the GPU's own (from `gpus()`, where a GPU that is
/// no longer listed counts as lost) and each unhealthy GPU instance's.
///
/// # Errors
/// NVML fails to list the GPUs.
pub fn node_health(engine: &Engine) -> Result<Vec<GpuHealth>, GpuError> {
    let backend = engine.backend();
    let listed = backend.gpus()?;
    Ok(engine
        .gpus()
        .iter()
        .map(|g| {
            let uuid = &g.info.uuid;
            let healthy = listed.iter().find(|l| l.uuid == *uuid).is_some_and(|l| l.healthy);
            let gpu = (!healthy).then(|| cause(backend.unhealthy_reason(uuid, None)));
            let instances = if g.info.mig_enabled && gpu.is_none() {
                let gis = backend.gpu_instances(uuid).unwrap_or_default();
                gis.iter()
                    .filter(|gi| !gi.healthy)
                    .map(|gi| (gi.profile_id, gi.start, cause(backend.unhealthy_reason(uuid, Some(gi.id)))))
                    .collect()
            } else {
                Vec::new()
            };
            GpuHealth { gpu, instances }
        })
        .collect())
}
