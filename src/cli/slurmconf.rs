//! `migdra slurm-conf`: the slurm.conf and gres.conf lines of a hybrid node, written so that
//! Slurm's GPU indexes and shard counts are the ones migdra publishes ([`crate::slurm::generate`]).
//!
//! The order comes from the administrator's map (`--slurm-index-map`) when it names this node's
//! GPUs, else from NVML order; Slurm's present files are not consulted, since these lines replace
//! them. The shards per GPU are `--shards-per-gpu`, else the GPU's memory slices. Once the lines
//! are installed and slurmd and migdra restarted, migdra reads the same indexes and shards back
//! (source `slurmd` or `gres.conf`). Table output is the configuration text itself; `-o json|yaml`
//! gives the lines, the records and each GPU's index. Reads only.

use super::{CliError, CliResult, Format, Global, backend, output};
use crate::mig::devices::GpuMode;
use crate::slurm::generate::{self, Config, GenerateError, GpuIn, Request};
use crate::slurm::{NodeGpu, Settings, Source};
use std::io::Write;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Directory of the GPU device files named in File= (tests point it at fake device nodes)
    #[arg(long, env = "MIGDRA_DEV_ROOT", default_value = "/dev", value_name = "DIR")]
    pub dev_root: PathBuf,
    /// Slurm GRES type of every GPU [default: from each GPU's model, h100-80gb → h100]
    #[arg(long, env = "MIGDRA_GRES_TYPE", value_name = "NAME")]
    pub gres_type: Option<String>,
    /// Print only one file's lines (table output): slurm.conf or gres.conf
    #[arg(long, value_enum, value_name = "FILE")]
    pub only: Option<Part>,
}

/// `--only` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    /// `GresTypes=` and the node's `Gres=`
    #[value(name = "slurm.conf")]
    SlurmConf,
    /// the node's whole gres.conf
    #[value(name = "gres.conf")]
    GresConf,
}

impl From<GenerateError> for CliError {
    fn from(e: GenerateError) -> Self {
        match e {
            GenerateError::NothingToList(_) => Self::Failed(e.to_string()),
            _ => Self::Usage(e.to_string()),
        }
    }
}

pub fn run(args: &Args, global: &Global, out: &mut dyn Write) -> CliResult {
    if let Some(t) = &args.gres_type {
        generate::check_type(t).map_err(|_| CliError::Usage(format!("--gres-type {t:?}: {}", generate::TYPE_RULE)))?;
    }
    generate::check_dev_root(&args.dev_root)?;
    let settings = global.slurm.settings(&backend::node_name(global))?;
    if settings.node_name.is_empty() {
        return Err(CliError::Usage("no Slurm node name: pass --slurm-node-name, --node-name or set NODE_NAME".into()));
    }
    // The engine knows each GPU's mode; it also resolves the indexes Slurm's present files give,
    // to say what changes once these lines are installed.
    let engine = backend::read_engine(global)?;
    let node_gpus: Vec<NodeGpu> = engine
        .gpus()
        .iter()
        .map(|g| NodeGpu {
            nvml_index: g.info.index,
            minor: g.info.minor,
            uuid: g.info.uuid.clone(),
            pci_bus_id: g.info.pci_bus_id.clone(),
            mig_enabled: g.info.mig_enabled,
            memory_slices: g.model.memory_slices,
            migs: Vec::new(),
        })
        .collect();
    let wanted_from = Settings {
        index_map: settings.index_map.clone(),
        shards_per_gpu: settings.shards_per_gpu,
        ..Settings::none(&settings.node_name)
    };
    let wanted = crate::slurm::resolve(&wanted_from, &node_gpus).map_err(|e| CliError::Usage(e.to_string()))?;
    // A map that cannot be used would silently give NVML order: refuse instead.
    if let (Some(map), Some(n)) = (&settings.index_map, wanted.notes.iter().find(|n| n.warning)) {
        return Err(CliError::Usage(format!("--slurm-index-map {}: {}", map.display(), n.message)));
    }
    let gpus: Vec<GpuIn> = engine
        .gpus()
        .iter()
        .zip(&wanted.gpus)
        .map(|(g, w)| GpuIn {
            nvml_index: g.info.index,
            minor: g.info.minor,
            uuid: g.info.uuid.clone(),
            model: g.model.key.clone(),
            static_mig: g.mode == GpuMode::Static,
            wanted: w.index.unwrap_or(g.info.index),
            shards: w.shards,
        })
        .collect();
    let req = Request {
        node: settings.node_name.clone(),
        dev_root: args.dev_root.clone(),
        gres_type: args.gres_type.clone(),
        from_map: wanted.source == Source::AdminMap,
    };
    let mut config = generate::generate(&gpus, &req)?;
    // What migdra publishes now, from Slurm's present files, where it differs.
    for (g, now) in config.gpus.iter().zip(engine.gpus()) {
        let (i, s) = (now.slurm.index, now.slurm.shards);
        if g.slurm_gpu_index.is_some() && (i, s) != (g.slurm_gpu_index, g.slurm_shards.unwrap_or(s)) {
            let i = i.map_or_else(|| "none".to_string(), |i| i.to_string());
            config.notes.push(format!(
                "migdra now gives GPU {} Slurm index {i} and {s} shards (from {}); install these \
                 lines, restart slurmd, then migdra",
                g.uuid, now.slurm.source
            ));
        }
    }
    match global.output {
        Format::Json | Format::Yaml => output::data(out, global.output, &config)?,
        Format::Table => text(&config, args.only, out)?,
    }
    Ok(())
}

/// The configuration as files: slurm.conf's lines, then gres.conf's.
fn text(c: &Config, only: Option<Part>, out: &mut dyn Write) -> std::io::Result<()> {
    if only != Some(Part::GresConf) {
        if only.is_none() {
            writeln!(
                out,
                "# ---- slurm.conf: GresTypes= once for the cluster; put Gres= on this node's NodeName= line ----"
            )?;
        }
        for l in &c.slurm_conf {
            writeln!(out, "{l}")?;
        }
    }
    if only != Some(Part::SlurmConf) {
        if only.is_none() {
            writeln!(out, "\n# ---- gres.conf on node {} (or add these lines to a shared one) ----", c.node_name)?;
        }
        for l in &c.gres_conf {
            writeln!(out, "{l}")?;
        }
    }
    // Notes added after the generator's (what migdra gives now) go with the gres.conf comments.
    for n in c.notes.iter().filter(|n| !c.gres_conf.iter().any(|l| l.ends_with(n.as_str()))) {
        writeln!(out, "# {n}")?;
    }
    Ok(())
}
