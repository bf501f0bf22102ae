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
use std::path::{Path, PathBuf};

/// The request file serve takes: one GPU UUID per line.
pub const REQUEST_FILE: &str = "health-clear";

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
    let path = request_path(&backend::plugin_dir(global));
    // Requests not yet taken stay: two operators' requests add up.
    let mut lines: Vec<String> =
        std::fs::read_to_string(&path).unwrap_or_default().lines().map(str::to_owned).collect();
    lines.extend(uuids.iter().cloned());
    lines.sort();
    lines.dedup();
    crate::files::write_atomic(&path, (lines.join("\n") + "\n").as_bytes(), 0o600, crate::files::Durability::Atomic)
        .map_err(|e| CliError::Failed(format!("failed to write {}: {e}", path.display())))?;
    writeln!(
        out,
        "asked migdra serve to clear the health of {}; it does so within its --health-interval (see its log)",
        uuids.join(", ")
    )?;
    Ok(())
}

/// Where the request file is in a plugin directory.
pub fn request_path(plugin_dir: &Path) -> PathBuf {
    plugin_dir.join(REQUEST_FILE)
}

/// Take the request, if there is one: the GPU UUIDs it names. Taken by a rename, so a request
/// written meanwhile waits for the next look instead of being lost.
pub fn take_request(plugin_dir: &Path) -> std::io::Result<Option<Vec<String>>> {
    let path = request_path(plugin_dir);
    let taken = plugin_dir.join(format!(".{REQUEST_FILE}-taken"));
    match std::fs::rename(&path, &taken) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    }
    let text = std::fs::read_to_string(&taken);
    let _ = std::fs::remove_file(&taken);
    Ok(Some(text?.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect()))
}
