//! `migdra profiles`: the catalog, read like `nvidia-smi mig -lgip` and `-lgipp` combined.

use super::{CliError, CliResult, Format, Global, output};
use crate::gpu::nvml::discovery::{self, MigState};
use crate::mig::catalog::{self, Evidence, GiProfile, GpuModel};
use crate::mig::discovered::{Difference, differences};
use serde::Serialize;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// GPU model (e.g. h100-80gb); without it, the models of --sim, of the GPUs behind --sim-state
    /// or --nvml-lib or --driver-root (a live node), or every model
    #[arg(long, env = "MIGDRA_MODEL")]
    pub model: Option<String>,
    /// What NVML itself answers for each GPU of this node (profiles, placements, memory, engines;
    /// whatever the MIG mode), beside the catalog's figures and what differs. Read-only
    #[arg(long, conflicts_with = "model")]
    pub nvml: bool,
}

/// JSON view of one model.
#[derive(Serialize)]
struct ModelView<'a> {
    model: &'a str,
    product_name: &'a str,
    architecture: &'a str,
    pci_device_ids: Vec<String>,
    memory_slices: u32,
    compute_slices: u32,
    evidence: Evidence,
    #[serde(skip_serializing_if = "str::is_empty")]
    note: &'a str,
    profiles: Vec<ProfileView<'a>>,
}

#[derive(Serialize)]
struct ProfileView<'a> {
    #[serde(flatten)]
    profile: &'a GiProfile,
    placement_list: Vec<Placement>,
}

#[derive(Serialize)]
struct Placement {
    start: u32,
    size: u32,
}

pub fn run(args: &Args, global: &Global, out: &mut dyn Write) -> CliResult {
    if args.nvml {
        return observed(global, out);
    }
    let models = models(args.model.as_deref(), global)?;
    match global.output {
        Format::Json | Format::Yaml => {
            let views: Vec<ModelView> = models.iter().map(|m| view(m)).collect();
            let f = global.output;
            if args.model.is_some() { output::data(out, f, &views[0])? } else { output::data(out, f, &views)? }
        }
        Format::Table => {
            for (i, m) in models.iter().enumerate() {
                if i > 0 {
                    writeln!(out)?;
                }
                table(m, out)?;
            }
        }
    }
    Ok(())
}

/// The models a command about profiles covers: `--model`, else the node's (live, simulator file
/// or `--sim`), else every model.
pub(super) fn models(model: Option<&str>, global: &Global) -> Result<Vec<GpuModel>, CliError> {
    if let Some(key) = model {
        let m = catalog::model(key).ok_or_else(|| {
            CliError::Usage(format!("unknown model {key:?}; valid models: {}", catalog::model_keys()))
        })?;
        return Ok(vec![m.clone()]);
    }
    // A live node (--nvml-lib or --driver-root, as the DaemonSet sets one) or a simulator state
    // file: its own GPUs' models, as NVML describes them.
    let live = global.nvml_lib.is_some() || global.driver_root.is_some();
    if global.sim.is_none() && (global.sim_state.is_some() || live) {
        let backend = super::backend::open(global)?;
        let mut models: Vec<GpuModel> = Vec::new();
        for gpu in backend.gpus()? {
            let m = backend.model(&gpu.uuid)?;
            if !models.iter().any(|k| k.key == m.key) {
                models.push(m);
            }
        }
        return Ok(models);
    }
    if let Some(spec) = &global.sim {
        let spec = crate::gpu::sim::SimSpec::parse(spec)?;
        let mut keys: Vec<GpuModel> = Vec::new();
        for m in spec.models() {
            if !keys.iter().any(|k| k.key == m.key) {
                keys.push(m.clone());
            }
        }
        return Ok(keys);
    }
    Ok(catalog::models().to_vec())
}

fn view(m: &GpuModel) -> ModelView<'_> {
    ModelView {
        model: &m.key,
        product_name: &m.product_name,
        architecture: &m.architecture,
        pci_device_ids: m.pci_device_ids.iter().map(|id| format!("0x{id:04X}")).collect(),
        memory_slices: m.memory_slices,
        compute_slices: m.compute_slices,
        evidence: m.evidence,
        note: &m.note,
        profiles: m
            .profiles
            .iter()
            .map(|p| ProfileView {
                profile: p,
                placement_list: p.placements.iter().map(|&start| Placement { start, size: p.memory_slices }).collect(),
            })
            .collect(),
    }
}

fn table(m: &GpuModel, out: &mut dyn Write) -> std::io::Result<()> {
    let ids: Vec<String> = m.pci_device_ids.iter().map(|id| format!("0x{id:04X}")).collect();
    writeln!(
        out,
        "{} ({}, {}): {} memory slices, {} compute slices, PCI {}",
        m.product_name,
        m.key,
        m.architecture,
        m.memory_slices,
        m.compute_slices,
        ids.join(" ")
    )?;
    let header = [
        "NAME",
        "IDX",
        "ID",
        "MAX",
        "GiB",
        "SM",
        "CE",
        "DEC",
        "ENC",
        "JPG",
        "OFA",
        "PLACEMENTS",
        "CI (ID:COUNT)",
        "EVIDENCE",
    ];
    let rows: Vec<Vec<String>> = m
        .profiles
        .iter()
        .map(|p| {
            let e = &p.engines;
            let cis: Vec<String> = p
                .ci_profiles
                .iter()
                .map(|c| format!("{}{}:{}", c.id, if c.is_default { "*" } else { "" }, c.max_instances))
                .collect();
            let evidence = match p.evidence {
                Evidence::Observed => "observed",
                Evidence::Inferred => "inferred",
                Evidence::Unverified => "UNVERIFIED",
            };
            vec![
                p.name.clone(),
                p.index.to_string(),
                p.id.to_string(),
                p.max_instances.to_string(),
                format!("{:.2}", p.memory_mib as f64 / 1024.0),
                p.multiprocessors.to_string(),
                e.copy.to_string(),
                e.decoders.to_string(),
                e.encoders.to_string(),
                e.jpeg.to_string(),
                e.ofa.to_string(),
                p.placements_text(),
                cis.join(" "),
                evidence.to_string(),
            ]
        })
        .collect();
    output::table(out, &header, &rows)?;
    for p in m.profiles.iter().filter(|p| !p.note.is_empty()) {
        writeln!(out, "  {}: {}", p.name, p.note)?;
    }
    if !m.note.is_empty() {
        writeln!(out, "  note: {}", m.note)?;
    }
    Ok(())
}

/// One GPU as NVML describes it, beside the catalog.
#[derive(Serialize)]
struct ObservedView<'a> {
    index: u32,
    uuid: &'a str,
    name: &'a str,
    pci_device_id: String,
    mig_mode: &'static str,
    /// The catalog model this GPU matches by PCI device ID or name, if any.
    catalog: Option<&'a str>,
    /// The model NVML's answers describe; absent when NVML answers no profiles.
    #[serde(skip_serializing_if = "Option::is_none")]
    nvml: Option<ModelView<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    differences: Vec<Difference>,
}

/// `profiles --nvml`: NVML's own answers for this node's GPUs and how they differ from the
/// catalog, so a driver or GPU that disagrees is seen before it is trusted.
fn observed(global: &Global, out: &mut dyn Write) -> CliResult {
    let backend = super::backend::open_nvml(global, false)?;
    let gpus = backend.observed();
    let views: Vec<ObservedView> = gpus
        .iter()
        .map(|(id, model)| {
            let known = discovery::catalog_model(id);
            let (nvml, error) = match model {
                Ok(m) => (Some(view(m)), None),
                Err(e) => (None, Some(e.to_string())),
            };
            let differences = match (known, model) {
                (Some(c), Ok(m)) => differences(c, m),
                _ => Vec::new(),
            };
            ObservedView {
                index: id.index,
                uuid: &id.uuid,
                name: &id.name,
                pci_device_id: format!("0x{:04X}", id.pci_device_id),
                mig_mode: match id.mig {
                    MigState::Enabled => "enabled",
                    MigState::Disabled => "disabled",
                    MigState::NotCapable => "not capable",
                },
                catalog: known.map(|c| c.key.as_str()),
                nvml,
                error,
                differences,
            }
        })
        .collect();
    if global.output != Format::Table {
        return Ok(output::data(out, global.output, &views)?);
    }
    for (i, (v, (_, model))) in views.iter().zip(&gpus).enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        let catalog = v.catalog.unwrap_or("none");
        writeln!(out, "GPU {} {} ({}, MIG {}), catalog model {catalog}", v.index, v.uuid, v.name, v.mig_mode)?;
        match (model, v.catalog) {
            (Err(e), _) => writeln!(out, "  NVML describes no MIG profiles: {e}")?,
            (Ok(m), known) => {
                table(m, out)?;
                match known {
                    None => writeln!(out, "  the catalog has no model for this GPU: migdra uses NVML's answers")?,
                    Some(_) if v.differences.is_empty() => writeln!(
                        out,
                        "  NVML confirms the catalog: every profile, slice, placement, memory, SM and engine figure"
                    )?,
                    Some(key) => {
                        writeln!(out, "  NVML differs from the catalog model {key}:")?;
                        for d in &v.differences {
                            writeln!(out, "    {} {}: catalog {}, NVML {}", d.profile, d.field, d.catalog, d.nvml)?;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
