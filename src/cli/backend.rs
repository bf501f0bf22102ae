//! Which GPUs a command talks to: the simulator (`--sim`, `--sim-state`) or NVML.

use super::{CliError, Global};
use crate::gpu::GpuBackend;
use crate::gpu::sim::{SimBackend, SimSpec};

/// The simulator the flags name. `--sim-state` alone reopens an existing file; with `--sim` too,
/// the file is created from the spec when missing.
pub fn open_sim(global: &Global) -> Result<SimBackend, CliError> {
    let spec = global.sim.as_deref().map(SimSpec::parse).transpose()?;
    let env_faults = std::env::var("MIGDRA_SIM_FAULTS").ok();
    let sim = match (&global.sim_state, &spec) {
        (Some(path), spec) => SimBackend::open(path, spec.as_ref())?,
        (None, Some(spec)) => SimBackend::in_memory(spec),
        (None, None) => {
            return Err(CliError::Usage(
                "no simulated GPUs: pass --sim MODEL:COUNT (e.g. h100-80gb:2) or --sim-state FILE".into(),
            ));
        }
    };
    Ok(sim.with_env_faults(env_faults.as_deref())?)
}

/// The backend for read-only commands.
pub fn open(global: &Global) -> Result<Box<dyn GpuBackend>, CliError> {
    if global.sim.is_none() && global.sim_state.is_none() {
        return Err(CliError::Usage(
            "this build has no NVML backend yet; pass --sim MODEL:COUNT or --sim-state FILE".into(),
        ));
    }
    Ok(Box::new(open_sim(global)?))
}
