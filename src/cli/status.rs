//! `migdra status`: what an operator asks first on a node. Per GPU its NVML index, minor, PCI bus
//! ID, UUID, Slurm index with the source that decided it, MIG mode, and each MIG instance with the
//! claim holding it; then how the Slurm index was decided and any warning. Reads the hardware and
//! the checkpoint only, so it is safe next to a running daemon.

use super::{CliError, CliResult, Format, Global, backend, layout, output};
use crate::mig::devices::GpuMode;
use crate::mig::naming::{DeviceName, NameStyle, PublishedName};
use crate::slurm::{Note, Source};
use crate::state::Checkpoint;
use serde::Serialize;
use std::io::Write;

/// An instance's device name as the slices publish it: a static instance's may carry its Slurm index.
fn published(device: &str, mode: GpuMode, slurm_mig_index: Option<u32>, style: NameStyle) -> String {
    match DeviceName::parse(device) {
        Ok(d) if mode == GpuMode::Static => PublishedName::new(style, d, slurm_mig_index).to_string(),
        _ => device.to_string(),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusView {
    gpus: Vec<GpuView>,
    slurm: SlurmView,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SlurmView {
    source: Source,
    rule: String,
    /// Slurm's release, from `slurmd -V` when slurmd was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    version: Option<String>,
    notes: Vec<Note>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GpuView {
    index: u32,
    minor: u32,
    #[serde(rename = "pciBusID")]
    pci_bus_id: String,
    uuid: String,
    model: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    slurm_gpu_index: Option<u32>,
    slurm_gpu_index_source: Source,
    slurm_shards: u32,
    mig_mode: &'static str,
    healthy: bool,
    /// NVML says GPU_IS_LOST: its instances cannot be read.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    lost: bool,
    instances: Vec<InstanceView>,
    /// Claims holding the whole GPU.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    claims: Vec<ClaimView>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InstanceView {
    device: String,
    profile: String,
    placement_start: u32,
    gpu_instance_id: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    compute_instance_id: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    slurm_mig_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    claim: Option<ClaimView>,
}

#[derive(Serialize, Clone)]
#[serde(rename_all = "camelCase")]
struct ClaimView {
    namespace: String,
    name: String,
    uid: String,
    state: String,
}

pub fn run(global: &Global, out: &mut dyn Write) -> CliResult {
    let engine = backend::read_engine(global)?;
    let checkpoint = engine.checkpoint().map_err(|e| CliError::Failed(e.to_string()))?;
    let backend = engine.backend();
    let mut gpus = Vec::new();
    for g in engine.gpus() {
        let (found, lost) = match layout::instances(backend.as_ref(), &g.info, &g.model) {
            Err(e) if layout::is_lost(&e) => (Vec::new(), true),
            r => (r?, false),
        };
        let instances = found
            .into_iter()
            .map(|i| {
                let ci = i.compute_instances.into_iter().next();
                let slurm_mig_index = ci.as_ref().and_then(|c| g.slurm.mig_index(i.gpu_instance_id, c.id));
                InstanceView {
                    slurm_mig_index,
                    claim: holder(&checkpoint, &g.info.uuid, Some(i.gpu_instance_id)).into_iter().next(),
                    device: published(&i.device, g.mode, slurm_mig_index, engine.options().device_names),
                    profile: i.profile,
                    placement_start: i.placement.start,
                    gpu_instance_id: i.gpu_instance_id,
                    compute_instance_id: ci.as_ref().map(|c| c.id),
                    uuid: ci.map(|c| c.uuid),
                }
            })
            .collect();
        gpus.push(GpuView {
            index: g.info.index,
            minor: g.info.minor,
            pci_bus_id: g.info.pci_bus_id.clone(),
            uuid: g.info.uuid.clone(),
            model: g.model.key.clone(),
            slurm_gpu_index: g.slurm.index,
            slurm_gpu_index_source: g.slurm.source,
            slurm_shards: g.slurm.shards,
            mig_mode: g.mode.as_str(),
            healthy: g.info.healthy,
            lost,
            instances,
            claims: holder(&checkpoint, &g.info.uuid, None),
        });
    }
    let s = engine.slurm();
    let view = StatusView {
        gpus,
        slurm: SlurmView { source: s.source, rule: s.rule.clone(), version: s.version.clone(), notes: s.notes.clone() },
    };
    match global.output {
        Format::Json | Format::Yaml => output::data(out, global.output, &view)?,
        Format::Table => table(&view, out)?,
    }
    Ok(())
}

/// The claims in the checkpoint on this GPU: on GPU instance `gi`, or (`None`) on the whole GPU.
fn holder(cp: &Checkpoint, gpu: &str, gi: Option<u32>) -> Vec<ClaimView> {
    cp.claims
        .values()
        .filter(|c| c.devices.iter().any(|d| d.gpu_uuid == gpu && d.mig.as_ref().map(|m| m.gi_id) == gi.map(Some)))
        .map(|c| ClaimView {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            uid: c.uid.clone(),
            state: format!("{:?}", c.state),
        })
        .collect()
}

fn table(view: &StatusView, out: &mut dyn Write) -> std::io::Result<()> {
    let opt = |v: Option<u32>| v.map_or_else(|| "-".into(), |v| v.to_string());
    let rows: Vec<Vec<String>> = view
        .gpus
        .iter()
        .map(|g| {
            vec![
                g.index.to_string(),
                g.minor.to_string(),
                g.pci_bus_id.clone(),
                g.uuid.clone(),
                g.model.clone(),
                opt(g.slurm_gpu_index),
                g.slurm_gpu_index_source.to_string(),
                g.slurm_shards.to_string(),
                g.mig_mode.into(),
                if g.lost {
                    "LOST"
                } else if g.healthy {
                    "yes"
                } else {
                    "NO"
                }
                .into(),
            ]
        })
        .collect();
    output::table(
        out,
        &["GPU", "MINOR", "PCI BUS ID", "UUID", "MODEL", "SLURM", "SOURCE", "SHARDS", "MIG", "HEALTHY"],
        &rows,
    )?;
    let claim = |c: &ClaimView| format!("{}/{} ({}, {})", c.namespace, c.name, c.uid, c.state);
    for g in &view.gpus {
        for c in &g.claims {
            writeln!(out, "GPU {} whole: claim {}", g.index, claim(c))?;
        }
        for i in &g.instances {
            writeln!(
                out,
                "GPU {} {}: GI {} CI {} {}{} — {}",
                g.index,
                i.device,
                i.gpu_instance_id,
                opt(i.compute_instance_id),
                i.uuid.as_deref().unwrap_or("(no compute instance)"),
                i.slurm_mig_index.map_or_else(String::new, |s| format!(", Slurm index {s}")),
                i.claim.as_ref().map_or_else(|| "no claim".into(), claim),
            )?;
        }
    }
    writeln!(out, "Slurm index: {} ({})", view.slurm.source, view.slurm.rule)?;
    if let Some(v) = &view.slurm.version {
        writeln!(out, "Slurm release: {v} (slurmd -V)")?;
    }
    for n in &view.slurm.notes {
        writeln!(out, "{}: {}", if n.warning { "warning" } else { "note" }, n.message)?;
    }
    Ok(())
}
