//! The `migdra` subcommands: clap types here, one file per command, exit codes at the edge.
//!
//! Exit codes: 0 success, 2 bad input (the message names the bad value and the valid choices),
//! 1 any other failure. Every error is one line.

mod backend;
mod claims;
mod cleanup;
mod cluster;
mod demo;
mod device_classes;
mod health;
mod layout;
mod output;
mod probe;
mod profiles;
mod serve;
mod sim;
mod slices;
mod slurmconf;
mod slurmflags;
mod status;
pub mod tested;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

pub use output::Format;

/// migdra: Kubernetes DRA kubelet plugin for NVIDIA MIG GPUs.
#[derive(Debug, Parser)]
#[command(name = "migdra", version, long_version = tested::LONG_VERSION, about, disable_help_subcommand = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub global: Global,
}

/// Flags every subcommand shares; each has an environment twin.
#[derive(Debug, Clone, clap::Args)]
pub struct Global {
    /// Simulated GPUs instead of NVML: MODEL:COUNT[:mig-off][,...], e.g. h100-80gb:2,a100-40gb:1:mig-off
    #[arg(long, global = true, env = "MIGDRA_SIM", value_name = "SPEC")]
    pub sim: Option<String>,
    /// File holding the simulated hardware, shared by every process that names it
    #[arg(long, global = true, env = "MIGDRA_SIM_STATE", value_name = "FILE")]
    pub sim_state: Option<std::path::PathBuf>,
    /// NVML library to load when not simulating; wins over --driver-root [default: found under
    /// --driver-root, else libnvidia-ml.so.1 on the loader path]
    #[arg(long, global = true, env = "MIGDRA_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<std::path::PathBuf>,
    /// The host's NVIDIA driver files as migdra sees them (the DaemonSet's /driver-root): without
    /// --nvml-lib, libnvidia-ml.so.1 is loaded from the first of DIR/usr/lib/<arch>-linux-gnu,
    /// its nvidia/current, DIR/usr/lib64 and DIR/usr/lib that has it, for the architecture migdra
    /// runs on, so one setting serves x86-64 and Arm nodes
    #[arg(long, global = true, env = "MIGDRA_DRIVER_ROOT", value_name = "DIR")]
    pub driver_root: Option<std::path::PathBuf>,
    /// Where the NVIDIA driver's procfs files are read (capability minors, /proc/devices, boot ID)
    #[arg(long, global = true, env = "MIGDRA_PROCFS_ROOT", value_name = "DIR", default_value = "/proc")]
    pub procfs_root: std::path::PathBuf,
    /// Where each GPU's PCIe root complex and NUMA node are read (DIR/bus/pci/devices), published
    /// as the standard attributes resource.kubernetes.io/pcieRoot and numaNode
    #[arg(long, global = true, env = "MIGDRA_SYSFS_ROOT", value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: std::path::PathBuf,
    /// The host's root as migdra sees it: a prepare checks that the device nodes the claim's CDI
    /// spec names by path (DIR/dev/nvidiactl, DIR/dev/nvidia<minor>, …) are character devices
    /// there, as the container runtime needs them, and fails naming a missing one; `none` skips
    /// the check [default: / with NVML; with --sim or --sim-state, no check]
    #[arg(long, global = true, env = "MIGDRA_HOST_ROOT", value_name = "DIR|none", value_parser = parse_host_root)]
    pub host_root: Option<HostRoot>,
    /// Output format
    #[arg(short = 'o', long, global = true, env = "MIGDRA_OUTPUT", value_enum, default_value_t)]
    pub output: Format,
    #[command(flatten)]
    pub node: NodeFlags,
    #[command(flatten)]
    pub slurm: slurmflags::SlurmFlags,
}

/// Where this node's plugin keeps its files, and how it treats MIG GPUs.
#[derive(Debug, Clone, clap::Args)]
pub struct NodeFlags {
    /// DRA driver name
    #[arg(long, global = true, env = "MIGDRA_DRIVER_NAME", default_value = "mig.slinky.slurm.net")]
    pub driver_name: String,
    /// This node's name (the pool name); default: the host name
    #[arg(long, global = true, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// Kubelet plugin directory [default: /var/lib/kubelet/plugins/<driver>]
    #[arg(long, global = true, env = "MIGDRA_PLUGIN_DIR")]
    pub plugin_dir: Option<std::path::PathBuf>,
    /// Directory the kubelet watches for registration sockets
    #[arg(long, global = true, env = "MIGDRA_REGISTRY_DIR", default_value = "/var/lib/kubelet/plugins_registry")]
    pub registry_dir: std::path::PathBuf,
    /// Checkpoint and lock files [default: the plugin directory]
    #[arg(long, global = true, env = "MIGDRA_STATE_DIR")]
    pub state_dir: Option<std::path::PathBuf>,
    /// CDI spec directory
    #[arg(long, global = true, env = "MIGDRA_CDI_DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: std::path::PathBuf,
    /// ResourceClaim objects (JSON or YAML, status.allocation filled) instead of the API server
    #[arg(long, global = true, env = "MIGDRA_CLAIMS_DIR", value_name = "DIR")]
    pub claims_dir: Option<std::path::PathBuf>,
    /// MIG GPUs: dynamic (migdra creates and destroys every instance) or static (an administrator's)
    #[arg(long, global = true, env = "MIGDRA_MIG_MODE", value_enum, default_value_t = MigModeFlag::Dynamic)]
    pub mig_mode: MigModeFlag,
    /// Per-GPU MIG mode, UUID-or-index=dynamic|static, comma-separated
    #[arg(long, global = true, env = "MIGDRA_MIG_MODE_OVERRIDE", value_delimiter = ',', value_name = "GPU=MODE")]
    pub mig_mode_override: Vec<String>,
    /// MIG instances on dynamic GPUs that no claim explains, found at start
    #[arg(long, global = true, env = "MIGDRA_ORPHANS", value_enum, default_value_t)]
    pub orphans: crate::prepare::OrphanPolicy,
    /// ResourceSlice layout: combined (counters beside devices, up to 1.34), split (counter-only
    /// and device-only slices, 1.35+), or auto (from the API server's version; `slices`, which asks
    /// no server, takes split)
    #[arg(long, global = true, env = "MIGDRA_SLICE_LAYOUT", value_enum, default_value_t)]
    pub slice_layout: SliceLayoutFlag,
    /// Order of each GPU's partitions in the slices; the scheduler takes the first that fits, so
    /// the order picks the placement: packed (profiles of up to two memory slices from the end of
    /// the GPU, larger ones from its start), ascending (every placement in ascending order) or
    /// best-fit (`serve` follows the node's claims and lists first, in each slice, the placements
    /// that cost their GPU the least room, published again after each allocation and release;
    /// packed until the claims are known, and in `slices`)
    #[arg(long, global = true, env = "MIGDRA_DEVICE_ORDER", value_enum, default_value_t)]
    pub device_order: DeviceOrderFlag,
    /// Device names: minor (gpu-<minor>…, as always) or slurm (whole GPUs and static MIG
    /// instances Slurm lists get their zero-padded Slurm index in front, e.g. 0003-gpu-1, so
    /// their plain string order is Slurm's order, as slurm-bridge's inventory reads it). Prepare
    /// accepts both forms whatever this says
    #[arg(long, global = true, env = "MIGDRA_DEVICE_NAMES", value_enum, default_value_t)]
    pub device_names: DeviceNamesFlag,
    /// MIG profiles dynamic GPUs publish, comma-separated (e.g. 1g.10gb,3g.40gb,7g.80gb) [default:
    /// all]. Fewer partitions make every MIG pod cheaper to schedule; instances that exist are
    /// published whatever their profile. A name only some GPU models have applies where it exists
    #[arg(long, global = true, env = "MIGDRA_PROFILES", value_delimiter = ',', value_name = "PROFILE")]
    pub profiles: Vec<String>,
    /// Device taint on every device of an unhealthy GPU (critical XID, GPU lost) while it stays
    /// unhealthy: NoSchedule (no new claims get it), NoExecute (also evicts the pods using it),
    /// None (shown, not enforced) or disabled (no taints). Needs DRADeviceTaints (Kubernetes 1.36+)
    #[arg(
        long,
        global = true,
        env = "MIGDRA_UNHEALTHY_TAINT_EFFECT",
        default_value = "NoSchedule",
        value_name = "EFFECT"
    )]
    pub unhealthy_taint_effect: String,
    /// kubeconfig for the API server [default: in-cluster, then ~/.kube/config]
    #[arg(long, global = true, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::path::PathBuf>,
}

impl NodeFlags {
    /// `--unhealthy-taint-effect`, checked.
    ///
    /// # Errors
    /// Not an effect nor `disabled`: bad input, naming the valid values.
    pub fn taint_policy(&self) -> Result<crate::mig::taints::TaintPolicy, CliError> {
        crate::mig::taints::TaintPolicy::parse(&self.unhealthy_taint_effect).map_err(CliError::Usage)
    }
}

/// `--host-root` values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostRoot {
    /// Look the nodes up under this directory.
    Dir(std::path::PathBuf),
    /// `none`: do not look.
    Unchecked,
}

/// `none`, or an absolute directory.
fn parse_host_root(s: &str) -> Result<HostRoot, String> {
    match s.trim() {
        "none" => Ok(HostRoot::Unchecked),
        dir if dir.starts_with('/') => Ok(HostRoot::Dir(dir.into())),
        _ => Err(format!("{s:?}: expected an absolute directory (the host's root as migdra sees it, e.g. /) or none")),
    }
}

/// `--slice-layout` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SliceLayoutFlag {
    /// From the API server's version: combined before 1.35, split from 1.35
    #[default]
    Auto,
    /// Counter sets and their devices in the same slice (Kubernetes 1.34 and older)
    Combined,
    /// Counter sets and devices in separate slices of one pool (Kubernetes 1.35 and newer)
    Split,
}

/// `--device-order` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceOrderFlag {
    /// Small profiles from the end of each GPU, large ones from its start (accepts more in churn)
    #[default]
    Packed,
    /// Every profile's placements in ascending order, as NVIDIA's driver publishes them
    Ascending,
    /// Re-ranked by what the node's claims hold: the best fit first, on the fuller GPU
    BestFit,
}

impl From<DeviceOrderFlag> for crate::packing::DeviceOrder {
    fn from(f: DeviceOrderFlag) -> Self {
        match f {
            DeviceOrderFlag::Packed => Self::Packed,
            DeviceOrderFlag::Ascending => Self::Ascending,
            DeviceOrderFlag::BestFit => Self::BestFit,
        }
    }
}

/// `--device-names` values.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceNamesFlag {
    /// gpu-<minor> and gpu-<minor>-mig-<profile>-<profileId>-<start>
    #[default]
    Minor,
    /// The Slurm index, 4 digits, in front of whole-GPU and static-MIG names: 0003-gpu-1
    Slurm,
}

impl From<DeviceNamesFlag> for crate::mig::naming::NameStyle {
    fn from(f: DeviceNamesFlag) -> Self {
        match f {
            DeviceNamesFlag::Minor => Self::Minor,
            DeviceNamesFlag::Slurm => Self::Slurm,
        }
    }
}

/// `--mig-mode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MigModeFlag {
    /// migdra owns every instance and publishes every possible partition
    Dynamic,
    /// instances made by an administrator; migdra never creates or destroys them
    Static,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// GPU instance profiles and placements of a model, like `nvidia-smi mig -lgip` and `-lgipp`
    Profiles(profiles::Args),
    /// Each GPU's memory slices and the MIG instance holding each
    Layout,
    /// DeviceClasses for the MIG profiles (with the device plugin's extended resource names), or
    /// slurm-bridge's deviceProfiles for them
    DeviceClasses(device_classes::Args),
    /// The ResourceSlices serve would publish for this node, as a dry run (validated)
    Slices(slices::Args),
    /// Per GPU: NVML index, minor, PCI bus ID, UUID, Slurm index and its source, MIG mode, and the
    /// instances with their claims. Reads only.
    Status,
    /// The slurm.conf and gres.conf lines of a hybrid node whose Slurm GPU indexes and shards are
    /// the ones migdra publishes. Reads only
    SlurmConf(slurmconf::Args),
    /// Drive the simulated GPUs by hand
    #[command(subcommand)]
    Sim(sim::SimCommand),
    /// Claims in the checkpoint; prepare, unprepare or recover by hand
    Claims(claims::Args),
    /// MIG instances no claim explains (dynamic GPUs only), CDI specs without a claim, and claims
    /// whose instance is gone; --dry-run lists them and changes nothing
    Cleanup(cleanup::Args),
    /// The kubelet plugin daemon
    Serve(serve::Args),
    /// Device health: `clear` asks the running serve to forget the XIDs of GPUs the operator has
    /// looked at, without a restart
    Health(health::Args),
    /// Ask a running serve what the kubelet would (GetInfo, then an empty NodePrepareResources);
    /// exit 0 only if both answer in time, and with --ready only if it publishes its
    /// ResourceSlices too. The DaemonSet's probes
    Probe(probe::Args),
    /// A day on a simulated node: the real daemon, driven over its sockets like a kubelet
    Demo(demo::Args),
    /// Every migdra node's GPUs from the API server: memory slices with a letter per claim, taints,
    /// and per profile the placements in use and free now. Also `kubectl migdra usage`
    Usage(cluster::UsageArgs),
    /// Why a pod (or claim/NAME) is pending: per request, the matching devices and, per GPU, what
    /// keeps them from it (claims holding the slices, fragmentation, a taint, a Slurm pin, a
    /// selector matching nothing). Also `kubectl migdra why`
    Why(cluster::WhyArgs),
}

/// How a command failed: bad input (exit 2) or anything else (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Failed(String),
}

pub type CliResult = Result<(), CliError>;

impl From<crate::gpu::GpuError> for CliError {
    fn from(e: crate::gpu::GpuError) -> Self {
        use crate::gpu::{GpuError, NvmlCode};
        match &e {
            GpuError::Invalid(_) | GpuError::UnknownGpu(_) | GpuError::SimState { .. } => Self::Usage(e.to_string()),
            GpuError::Nvml { code: NvmlCode::InvalidArgument, .. } => Self::Usage(e.to_string()),
            GpuError::Nvml { .. } | GpuError::Load { .. } | GpuError::Unsupported(_) | GpuError::Procfs { .. } => {
                Self::Failed(e.to_string())
            }
        }
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        Self::Failed(format!("failed to write output: {e}"))
    }
}

/// Run the CLI with these arguments, writing to `out`.
pub fn run(cli: Cli, out: &mut dyn std::io::Write) -> CliResult {
    match cli.command {
        Command::Profiles(args) => profiles::run(&args, &cli.global, out),
        Command::Layout => layout::run(&cli.global, out),
        Command::DeviceClasses(args) => device_classes::run(&args, &cli.global, out),
        Command::Status => status::run(&cli.global, out),
        Command::Slices(args) => slices::run(&args, &cli.global, out),
        Command::SlurmConf(args) => slurmconf::run(&args, &cli.global, out),
        Command::Sim(cmd) => sim::run(&cmd, &cli.global, out),
        Command::Claims(args) => claims::run(&args, &cli.global, out),
        Command::Cleanup(args) => cleanup::run(&args, &cli.global, out),
        Command::Serve(args) => serve::run(&args, &cli.global),
        Command::Health(args) => health::run(&args, &cli.global, out),
        Command::Probe(args) => probe::run(&args, &cli.global, out),
        Command::Demo(args) => demo::run(&args, out),
        Command::Usage(args) => cluster::usage(&args, &cluster::Flags::of(&cli.global), out),
        Command::Why(args) => cluster::why(&args, &cluster::Flags::of(&cli.global), out),
    }
}

/// clap's own message (help and version too, on stdout): exit 2 for bad input, else 0.
fn parse_failed(e: &clap::Error) -> ExitCode {
    let _ = e.print();
    if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS }
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    // Linked as `kubectl-migdra`, the binary is a kubectl plugin with a command line of its own.
    let plugin = std::env::args_os()
        .next()
        .and_then(|a| std::path::Path::new(&a).file_name().map(|n| n.to_string_lossy().starts_with("kubectl-migdra")))
        .unwrap_or(false);
    let mut stdout = std::io::stdout().lock();
    let result = if plugin {
        match cluster::PluginCli::try_parse() {
            Ok(cli) => cluster::plugin(cli, &mut stdout),
            Err(e) => return parse_failed(&e),
        }
    } else {
        match Cli::try_parse() {
            Ok(cli) => run(cli, &mut stdout),
            Err(e) => return parse_failed(&e),
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            output::error_line(&e.to_string());
            ExitCode::from(match e {
                CliError::Usage(_) => 2,
                CliError::Failed(_) => 1,
            })
        }
    }
}
