//! MIG instance helpers that prepare, unprepare, recovery and cleanup share.

use crate::gpu::{GpuBackend, GpuError, GpuInstance, NvmlCode};
use crate::state::MigRecord;

/// Whether a checkpointed MIG device is this GI: by ID when recorded, else by its intent.
pub(super) fn holds(m: &MigRecord, gi: &GpuInstance) -> bool {
    match m.gi_id {
        Some(id) => id == gi.id && m.profile_id == gi.profile_id && m.start == gi.start,
        None => m.profile_id == gi.profile_id && m.start == gi.start,
    }
}

/// NOT_FOUND on a destroy means someone already did it.
pub(super) fn gone_ok(r: Result<(), GpuError>) -> Result<(), GpuError> {
    match r {
        Err(e) if e.code() == Some(NvmlCode::NotFound) => Ok(()),
        r => r,
    }
}

/// Destroy a GI's CIs (the one we know of, or all) and then the GI.
pub(super) fn destroy_gi(backend: &dyn GpuBackend, gpu: &str, gi: u32, ci: Option<u32>) -> Result<(), GpuError> {
    let cis = match backend.compute_instances(gpu, gi) {
        Ok(cis) => cis.into_iter().map(|c| c.id).collect(),
        Err(e) if e.code() == Some(NvmlCode::NotFound) => return Ok(()),
        Err(_) => ci.into_iter().collect::<Vec<_>>(),
    };
    for c in cis {
        gone_ok(backend.destroy_compute_instance(gpu, gi, c))?;
    }
    gone_ok(backend.destroy_gpu_instance(gpu, gi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::sim::{Fault, SimBackend, SimSpec};
    use crate::state::MigOwner;

    const P1G: u32 = 19; // H100 80GB 1g.10gb
    const P3G: u32 = 9; // H100 80GB 3g.40gb

    fn h100() -> (SimBackend, String) {
        let sim = SimBackend::in_memory_seeded(&SimSpec::parse("h100-80gb:1").unwrap(), 7);
        let uuid = sim.gpus().unwrap()[0].uuid.clone();
        (sim, uuid)
    }

    #[test]
    fn a_record_holds_a_gi_by_id_once_known_and_by_intent_before() {
        let gi = GpuInstance { id: 3, profile_id: P3G, start: 4, size: 4, healthy: true };
        let mut m = MigRecord::intent(MigOwner::Dynamic, P3G, "3g.40gb", 4, 4);
        assert!(holds(&m, &gi), "intent alone: profile and placement");
        m.gi_id = Some(3);
        assert!(holds(&m, &gi));
        m.gi_id = Some(5);
        assert!(!holds(&m, &gi), "the driver reused the placement for another GI");
        let elsewhere = GpuInstance { start: 0, ..gi };
        assert!(!holds(&MigRecord::intent(MigOwner::Dynamic, P3G, "3g.40gb", 4, 4), &elsewhere));
    }

    #[test]
    fn destroy_gi_removes_every_ci_then_the_gi_and_repeats_cleanly() {
        let (sim, gpu) = h100();
        let gi = sim.create_gpu_instance(&gpu, P1G, 0).unwrap();
        sim.create_compute_instance(&gpu, gi.id, 0).unwrap();
        destroy_gi(&sim, &gpu, gi.id, None).unwrap();
        assert!(sim.gpu_instances(&gpu).unwrap().is_empty());
        destroy_gi(&sim, &gpu, gi.id, None).unwrap();
    }

    #[test]
    fn destroy_gi_reports_what_nvml_refuses() {
        let (sim, gpu) = h100();
        let gi = sim.create_gpu_instance(&gpu, P1G, 0).unwrap();
        sim.add_fault(Fault::parse("destroy-gi=in-use:1").unwrap()).unwrap();
        let err = destroy_gi(&sim, &gpu, gi.id, None).unwrap_err();
        assert_eq!(err.code(), Some(NvmlCode::InUse));
        assert_eq!(sim.gpu_instances(&gpu).unwrap().len(), 1, "nothing was destroyed");
        assert!(gone_ok(Err(GpuError::Nvml { op: "x", gpu: gpu.clone(), code: NvmlCode::NotFound })).is_ok());
    }
}
