//! Which GPUs a command talks to: the simulator (`--sim`, `--sim-state`) or NVML.

use super::{CliError, Global, HostRoot, MigModeFlag};
use crate::gpu::GpuBackend;
use crate::gpu::nvml::{NvmlBackend, NvmlOptions};
use crate::gpu::procfs::Procfs;
use crate::gpu::sim::{SimBackend, SimSpec};
use crate::prepare::{Engine, Options};
use std::sync::Arc;

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

/// The backend for read-only commands: the simulator when `--sim` or `--sim-state` is given,
/// NVML otherwise.
pub fn open(global: &Global) -> Result<Box<dyn GpuBackend>, CliError> {
    open_with_events(global, false)
}

/// The backend, with NVML's XID events watched when `events` (the daemon's health stream).
fn open_with_events(global: &Global, events: bool) -> Result<Box<dyn GpuBackend>, CliError> {
    if !simulated(global) {
        return Ok(Box::new(open_nvml(global, events)?));
    }
    Ok(Box::new(open_sim(global)?))
}

/// NVML itself, for what only a real GPU answers; refused with the simulator's flags.
pub fn open_nvml(global: &Global, events: bool) -> Result<NvmlBackend, CliError> {
    if simulated(global) {
        return Err(CliError::Usage(
            "this reads NVML, not the simulator: drop --sim/--sim-state (and MIGDRA_SIM*) and pass \
             --nvml-lib or --driver-root if the library is not on the loader path"
                .into(),
        ));
    }
    let opts = NvmlOptions {
        lib_path: global.nvml_lib.clone(),
        driver_root: global.driver_root.clone(),
        procfs: Procfs::new(&global.procfs_root),
        watch_events: events,
        sysfs_root: Some(global.sysfs_root.clone()),
    };
    Ok(NvmlBackend::open(&opts)?)
}

/// Whether the GPUs are the simulator's (`--sim`, `--sim-state`) rather than NVML's.
fn simulated(global: &Global) -> bool {
    global.sim.is_some() || global.sim_state.is_some()
}

/// Where prepare looks for the host device nodes (`--host-root`): given, or `/` on NVML. The
/// simulator's GPUs have no nodes (the demo runs on a laptop), so it checks only when told where.
fn host_root(global: &Global) -> Option<std::path::PathBuf> {
    match &global.host_root {
        Some(HostRoot::Dir(dir)) => Some(dir.clone()),
        Some(HostRoot::Unchecked) => None,
        None if simulated(global) => None,
        None => Some("/".into()),
    }
}

/// The plugin directory: `--plugin-dir`, or the kubelet's default for this driver.
pub fn plugin_dir(global: &Global) -> std::path::PathBuf {
    global
        .node
        .plugin_dir
        .clone()
        .unwrap_or_else(|| std::path::Path::new("/var/lib/kubelet/plugins").join(&global.node.driver_name))
}

/// The state directory: `--state-dir`, or the plugin directory.
pub fn state_dir(global: &Global) -> std::path::PathBuf {
    global.node.state_dir.clone().unwrap_or_else(|| plugin_dir(global))
}

/// This node's name: `--node-name`/`NODE_NAME`, or the host name.
pub fn node_name(global: &Global) -> String {
    global.node.node_name.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default()
    })
}

/// The prepare engine the flags describe (with the crash points of test builds).
pub fn engine(global: &Global) -> Result<Engine, CliError> {
    engine_with_events(global, true)
}

/// The engine for commands that only read (`status`, `cleanup --dry-run`): NVML's XID events are
/// not watched, and a state directory that does not exist is not created (no daemon ran here, so
/// the checkpoint is empty).
pub fn read_engine(global: &Global) -> Result<Engine, CliError> {
    let state = state_dir(global);
    if state.is_dir() {
        return engine_with_events(global, false);
    }
    let mut g = global.clone();
    let scratch = std::env::temp_dir().join(format!("migdra-no-state-{}", std::process::id()));
    g.node.state_dir = Some(scratch.clone());
    let engine = engine_with_events(&g, false);
    let _ = std::fs::remove_dir(&scratch);
    engine
}

/// The engine, watching NVML's XID events when `events` (the daemon's health stream).
pub fn engine_with_events(global: &Global, events: bool) -> Result<Engine, CliError> {
    use crate::mig::devices::GpuMode;
    let mode = |m: MigModeFlag| match m {
        MigModeFlag::Dynamic => GpuMode::Dynamic,
        MigModeFlag::Static => GpuMode::Static,
    };
    let mut opts =
        Options::new(&global.node.driver_name, &node_name(global), state_dir(global), global.node.cdi_dir.clone());
    // KEP-5304 puts the files in the plugin directory, wherever the state goes.
    opts.metadata_dir = plugin_dir(global).join(crate::cdi::metadata::SUBDIR);
    opts.mig_mode = mode(global.node.mig_mode);
    opts.orphans = global.node.orphans;
    opts.device_names = global.node.device_names.into();
    opts.profiles = crate::mig::allowlist::Allowlist::new(&global.node.profiles);
    opts.host_root = host_root(global);
    opts.slurm = global.slurm.settings(&node_name(global))?;
    for o in &global.node.mig_mode_override {
        let (gpu, m) = o.split_once('=').ok_or_else(|| {
            CliError::Usage(format!("--mig-mode-override {o:?}: expected GPU=dynamic|static (GPU: UUID or NVML index)"))
        })?;
        let m = match m.trim() {
            "dynamic" => GpuMode::Dynamic,
            "static" => GpuMode::Static,
            other => {
                return Err(CliError::Usage(format!(
                    "--mig-mode-override {o:?}: mode {other:?} is not dynamic or static"
                )));
            }
        };
        opts.mode_overrides.push((gpu.trim().to_string(), m));
    }
    let backend: Arc<dyn GpuBackend> = Arc::from(open_with_events(global, events)?);
    let engine = Engine::new(backend, opts).map_err(|e| match e {
        crate::prepare::PrepareError::Slurm(_) | crate::prepare::PrepareError::Profiles(_) => {
            CliError::Usage(e.to_string())
        }
        _ => CliError::Failed(e.to_string()),
    })?;
    crash_points(engine)
}

/// `MIGDRA_CRASH_AT=<step>` makes the process SIGKILL itself right after that step, so tests can
/// prove recovery from a crash at every point. Only in builds with the `crash-points` feature
/// (the tests enable it): a shipped binary must not let an environment variable kill it.
#[cfg(feature = "crash-points")]
fn crash_points(engine: Engine) -> Result<Engine, CliError> {
    let Ok(step) = std::env::var("MIGDRA_CRASH_AT") else { return Ok(engine) };
    use crate::prepare::Step;
    let step = Step::parse(&step).ok_or_else(|| {
        let names: Vec<&str> = Step::ALL.iter().chain(&Step::RECOVERY).chain(&Step::API).map(|s| s.name()).collect();
        CliError::Usage(format!("MIGDRA_CRASH_AT={step:?} is not a step; valid: {}", names.join(", ")))
    })?;
    let hook: crate::prepare::Hook = Arc::new(move |s| {
        if s == step {
            // SIGKILL, as an OOM kill or node drain would: no unwinding, no destructors, no
            // rollback. The kernel delivers it before the call returns, so at the step; abort if
            // it cannot be sent.
            let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
            std::process::abort();
        }
    });
    crate::prepare::set_process_hook(hook.clone());
    Ok(engine.with_hook(hook))
}

#[cfg(not(feature = "crash-points"))]
fn crash_points(engine: Engine) -> Result<Engine, CliError> {
    Ok(engine)
}
