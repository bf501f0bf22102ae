//! `migdra health clear`: the operator's way back for a GPU that a critical XID made unhealthy.
//!
//! An XID means someone should look, so migdra never heals one by itself (a GPU that was lost and
//! answers NVML again was reset, and that heals it). Once the operator has looked, this command
//! asks the running `migdra serve` of the node, through a request file in the plugin directory,
//! to forget the GPUs' errors: within one `--health-interval` the health stream reports them
//! healthy and their device taints go, without restarting the DaemonSet. Run it where serve's
//! directories are, e.g. `kubectl exec -n migdra-system <migdra pod> -- migdra health clear --gpu 0`.

use super::{CliError, CliResult, Global, backend};
use std::io::Write;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: HealthCommand,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum HealthCommand {
    /// Ask the running serve to forget the errors of these GPUs and their instances
    Clear {
        /// GPU by NVML index or UUID; repeat it for several. Without it: every GPU of the node
        #[arg(long = "gpu", value_name = "GPU")]
        gpus: Vec<String>,
    },
}

pub fn run(args: &Args, global: &Global, out: &mut dyn Write) -> CliResult {
    let HealthCommand::Clear { gpus: wanted } = &args.command;
    let found = backend::open(global)?.gpus()?;
    let mut uuids = Vec::new();
    for w in wanted {
        let gpu =
            found.iter().find(|g| g.uuid.eq_ignore_ascii_case(w) || g.index.to_string() == *w).ok_or_else(|| {
                let known: Vec<String> = found.iter().map(|g| format!("{} ({})", g.index, g.uuid)).collect();
                CliError::Usage(format!("--gpu {w:?} is not a GPU of this node; known: {}", known.join(", ")))
            })?;
        uuids.push(gpu.uuid.clone());
    }
    if wanted.is_empty() {
        uuids = found.iter().map(|g| g.uuid.clone()).collect();
    }
    let dir = backend::plugin_dir(global);
    crate::daemon::health_request::add(&dir, &uuids).map_err(|e| {
        let path = crate::daemon::health_request::request_path(&dir);
        CliError::Failed(format!("failed to write {}: {e}", path.display()))
    })?;
    writeln!(
        out,
        "asked migdra serve to clear the health of {}; it does so within its --health-interval (see its log)",
        uuids.join(", ")
    )?;
    Ok(())
}
