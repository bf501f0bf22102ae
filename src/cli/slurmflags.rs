//! Where migdra finds Slurm's view of this node's GPUs (see [`crate::slurm`] for the precedence).

use super::CliError;
use crate::slurm::Settings;
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct SlurmFlags {
    /// GPU → Slurm index map, one `GPU-UUID-or-PCI-bus-ID: index` per line (a mounted ConfigMap);
    /// wins over Slurm's files
    #[arg(long, global = true, env = "MIGDRA_SLURM_INDEX_MAP", value_name = "FILE")]
    pub slurm_index_map: Option<PathBuf>,
    /// slurm.conf of the cluster this node belongs to
    #[arg(
        long,
        global = true,
        env = "MIGDRA_SLURM_CONF",
        default_value = "/etc/slurm/slurm.conf",
        value_name = "FILE"
    )]
    pub slurm_conf: PathBuf,
    /// gres.conf [default: gres.conf beside slurm.conf]
    #[arg(long, global = true, env = "MIGDRA_SLURM_GRES_CONF", value_name = "FILE")]
    pub slurm_gres_conf: Option<PathBuf>,
    /// slurmd binary asked for its GPU list (`slurmd -G`) when present; `none` never asks
    #[arg(long, global = true, env = "MIGDRA_SLURMD", default_value = "slurmd", value_name = "PATH")]
    pub slurmd: String,
    /// This node's name in slurm.conf's NodeName= [default: the node name]
    #[arg(long, global = true, env = "MIGDRA_SLURM_NODE_NAME", value_name = "NAME")]
    pub slurm_node_name: Option<String>,
    /// Slurm shards per GPU where Slurm's configuration gives none [default: the GPU's memory slices]
    #[arg(long, global = true, env = "MIGDRA_SHARDS_PER_GPU", value_name = "N")]
    pub shards_per_gpu: Option<u32>,
}

impl SlurmFlags {
    /// The settings for a node named `node` in Kubernetes.
    ///
    /// # Errors
    /// `--shards-per-gpu 0`.
    pub fn settings(&self, node: &str) -> Result<Settings, CliError> {
        if self.shards_per_gpu == Some(0) {
            return Err(CliError::Usage("--shards-per-gpu 0: a GPU stands for at least 1 shard".into()));
        }
        Ok(Settings {
            index_map: self.slurm_index_map.clone(),
            slurm_conf: self.slurm_conf.clone(),
            gres_conf: self.slurm_gres_conf.clone(),
            slurmd: (!self.slurmd.eq_ignore_ascii_case("none") && !self.slurmd.is_empty())
                .then(|| PathBuf::from(&self.slurmd)),
            node_name: self.slurm_node_name.clone().unwrap_or_else(|| node.to_string()),
            shards_per_gpu: self.shards_per_gpu,
        })
    }
}
