//! `migdra sim …`: drive the simulated GPUs by hand (create, destroy, reboot, faults, processes,
//! health). Every subcommand changes the `--sim-state` file, so it needs one.

use super::{CliError, CliResult, Format, Global, backend, output};
use crate::gpu::GpuBackend;
use crate::gpu::sim::{Fault, SimBackend};
use crate::mig::catalog::GiProfile;
use crate::mig::rules::{self, Placed};
use serde::Serialize;
use std::io::Write;

#[derive(Debug, clap::Subcommand)]
pub enum SimCommand {
    /// Create a GPU instance at a placement, and its default compute instance
    Create {
        /// GPU by NVML index or UUID
        #[arg(long)]
        gpu: String,
        /// Profile by name (3g.40gb) or ID (9)
        #[arg(long)]
        profile: String,
        /// Placement start, in memory slices
        #[arg(long)]
        placement: u32,
        /// Create only the GPU instance, no compute instance
        #[arg(long)]
        no_ci: bool,
    },
    /// Destroy a GPU instance: its compute instances first, then itself
    Destroy {
        #[arg(long)]
        gpu: String,
        /// GPU instance ID
        #[arg(long)]
        gi: u32,
    },
    /// Reboot the node: every instance and process vanishes and the boot ID changes
    Reboot,
    /// Inject faults (OP=ERROR[:COUNT], OP=delay:DURATION[:COUNT], @P, #GPU), or clear them
    Fail {
        /// e.g. create-gi=insufficient-resources:1 destroy-gi=delay:1s
        #[arg(required_unless_present = "clear")]
        faults: Vec<String>,
        /// Remove every persisted fault
        #[arg(long, conflicts_with = "faults")]
        clear: bool,
    },
    /// Start a simulated process on a MIG device, so destroying it fails with IN_USE
    Process {
        #[arg(long)]
        gpu: String,
        #[arg(long, required_unless_present = "clear")]
        gi: Option<u32>,
        #[arg(long, default_value_t = 0)]
        ci: u32,
        /// End every process on the GPU instead
        #[arg(long)]
        clear: bool,
    },
    /// Mark a GPU or one of its GPU instances healthy or unhealthy
    Health {
        #[arg(long)]
        gpu: String,
        /// Only this GPU instance
        #[arg(long)]
        gi: Option<u32>,
        /// Mark it unhealthy (default: healthy)
        #[arg(long)]
        unhealthy: bool,
    },
}

#[derive(Serialize)]
struct Created {
    gpu: String,
    profile: String,
    profile_id: u32,
    start: u32,
    size: u32,
    gpu_instance_id: u32,
    compute_instance_id: Option<u32>,
    uuid: Option<String>,
}

pub fn run(cmd: &SimCommand, global: &Global, out: &mut dyn Write) -> CliResult {
    if global.sim_state.is_none() {
        return Err(CliError::Usage("sim commands change the simulated hardware: pass --sim-state FILE".into()));
    }
    let sim = backend::open_sim(global)?;
    match cmd {
        SimCommand::Create { gpu, profile, placement, no_ci } => {
            create(&sim, gpu, profile, *placement, *no_ci, global.output, out)
        }
        SimCommand::Destroy { gpu, gi } => {
            let uuid = uuid_of(&sim, gpu)?;
            for ci in sim.compute_instances(&uuid, *gi)? {
                sim.destroy_compute_instance(&uuid, *gi, ci.id)?;
            }
            sim.destroy_gpu_instance(&uuid, *gi)?;
            done(out, global.output, &format!("destroyed GPU instance {gi} on GPU {gpu}"))
        }
        SimCommand::Reboot => {
            sim.reboot()?;
            done(out, global.output, &format!("rebooted; boot ID {}", sim.boot_id()?))
        }
        SimCommand::Fail { faults, clear } => {
            if *clear {
                sim.clear_faults()?;
                return done(out, global.output, "cleared every fault");
            }
            let parsed = faults.iter().map(|f| Fault::parse_list(f)).collect::<Result<Vec<_>, _>>()?;
            for f in parsed.into_iter().flatten() {
                let text = f.to_string();
                sim.add_fault(f)?;
                writeln!(out, "added fault {text}")?;
            }
            Ok(())
        }
        SimCommand::Process { gpu, gi, ci, clear } => {
            if *clear {
                sim.clear_processes(gpu)?;
                return done(out, global.output, &format!("ended every process on GPU {gpu}"));
            }
            let gi = gi.unwrap_or_default();
            sim.add_process(gpu, gi, *ci)?;
            done(out, global.output, &format!("started a process on GPU {gpu} GI {gi} CI {ci}"))
        }
        SimCommand::Health { gpu, gi, unhealthy } => {
            match gi {
                Some(gi) => sim.set_instance_health(gpu, *gi, !unhealthy)?,
                None => sim.set_gpu_health(gpu, !unhealthy)?,
            }
            let what = gi.map_or_else(|| format!("GPU {gpu}"), |gi| format!("GPU {gpu} GI {gi}"));
            done(out, global.output, &format!("{what} is {}", if *unhealthy { "unhealthy" } else { "healthy" }))
        }
    }
}

fn done(out: &mut dyn Write, format: Format, message: &str) -> CliResult {
    match format {
        Format::Json | Format::Yaml => output::data(out, format, &serde_json::json!({ "result": message }))?,
        Format::Table => writeln!(out, "{message}")?,
    }
    Ok(())
}

fn uuid_of(sim: &SimBackend, gpu: &str) -> Result<String, CliError> {
    let index = sim.resolve(gpu)?;
    let gpus = sim.gpus()?;
    Ok(gpus.into_iter().find(|g| g.index == index).map(|g| g.uuid).unwrap_or_default())
}

fn create(
    sim: &SimBackend,
    gpu: &str,
    profile: &str,
    start: u32,
    no_ci: bool,
    format: Format,
    out: &mut dyn Write,
) -> CliResult {
    let uuid = uuid_of(sim, gpu)?;
    let model = sim.model(&uuid)?;
    let p: &GiProfile = profile
        .parse::<u32>()
        .ok()
        .and_then(|id| model.profile(id))
        .or_else(|| model.profile_by_name(profile))
        .ok_or_else(|| {
            CliError::Usage(format!(
                "profile {profile:?} does not exist on {} (GPU {gpu}); valid: {}",
                model.key,
                model.profile_names()
            ))
        })?;
    rules::check_placement(&model, Placed { profile_id: p.id, start }).map_err(|r| CliError::Usage(r.to_string()))?;
    let gi = sim.create_gpu_instance(&uuid, p.id, start)?;
    let ci = if no_ci {
        None
    } else {
        let ci_profile = p.default_ci().map(|c| c.id).unwrap_or_default();
        match sim.create_compute_instance(&uuid, gi.id, ci_profile) {
            Ok(ci) => Some(ci),
            Err(e) => {
                // Leave nothing half-made: a GI without its CI is what the anchor leaks.
                let _ = sim.destroy_gpu_instance(&uuid, gi.id);
                return Err(e.into());
            }
        }
    };
    let created = Created {
        gpu: uuid,
        profile: p.name.clone(),
        profile_id: p.id,
        start: gi.start,
        size: gi.size,
        gpu_instance_id: gi.id,
        compute_instance_id: ci.as_ref().map(|c| c.id),
        uuid: ci.as_ref().map(|c| c.uuid.clone()),
    };
    match format {
        Format::Json | Format::Yaml => output::data(out, format, &created)?,
        Format::Table => {
            writeln!(
                out,
                "created GPU instance ID {} on GPU {gpu} using profile {} (ID {}) at {}:{}",
                gi.id, p.name, p.id, gi.start, gi.size
            )?;
            if let Some(ci) = ci {
                writeln!(out, "created compute instance ID {} in GPU instance ID {}: {}", ci.id, gi.id, ci.uuid)?;
            }
        }
    }
    Ok(())
}
