//! `migdra layout`: each GPU's memory slices and which instance holds each, as a compact
//! picture, or as JSON listing every instance. Reads only; never changes the hardware.

use super::{CliResult, Format, Global, backend, output};
use crate::gpu::{ComputeInstance, GpuBackend, GpuInfo};
use crate::mig::naming::DeviceName;
use serde::Serialize;
use std::io::Write;

#[derive(Serialize)]
pub(super) struct GpuView {
    #[serde(flatten)]
    pub(super) gpu: GpuInfo,
    pub(super) memory_slices: u32,
    /// NVML says GPU_IS_LOST (fallen off the bus): its instances cannot be read.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) lost: bool,
    pub(super) instances: Vec<InstanceView>,
}

#[derive(Serialize)]
pub(super) struct InstanceView {
    pub(super) device: String,
    pub(super) profile: String,
    pub(super) profile_id: u32,
    pub(super) placement: Placement,
    pub(super) gpu_instance_id: u32,
    pub(super) compute_instances: Vec<ComputeInstance>,
}

#[derive(Serialize)]
pub(super) struct Placement {
    pub(super) start: u32,
    pub(super) size: u32,
}

#[derive(Serialize)]
pub(super) struct LayoutView {
    pub(super) boot_id: String,
    pub(super) gpus: Vec<GpuView>,
}

pub fn run(global: &Global, out: &mut dyn Write) -> CliResult {
    let backend = backend::open(global)?;
    let layout = read(backend.as_ref())?;
    match global.output {
        Format::Json | Format::Yaml => output::data(out, global.output, &layout)?,
        Format::Table => picture(&layout, out)?,
    }
    Ok(())
}

pub(super) fn read(backend: &dyn GpuBackend) -> Result<LayoutView, crate::gpu::GpuError> {
    let mut gpus = Vec::new();
    for gpu in backend.gpus()? {
        let model = backend.model(&gpu.uuid)?;
        let (instances, lost) = match instances(backend, &gpu, &model) {
            Err(e) if is_lost(&e) => (Vec::new(), true),
            r => (r?, false),
        };
        gpus.push(GpuView { gpu, memory_slices: model.memory_slices, lost, instances });
    }
    Ok(LayoutView { boot_id: backend.boot_id()?, gpus })
}

/// Whether NVML says the GPU fell off the bus: the other GPUs are still shown.
pub(super) fn is_lost(e: &crate::gpu::GpuError) -> bool {
    e.code() == Some(crate::gpu::NvmlCode::GpuIsLost)
}

/// A GPU's MIG instances in placement order, each with its device name and compute instances.
pub(super) fn instances(
    backend: &dyn GpuBackend,
    gpu: &GpuInfo,
    model: &crate::mig::catalog::GpuModel,
) -> Result<Vec<InstanceView>, crate::gpu::GpuError> {
    if !gpu.mig_enabled {
        return Ok(Vec::new());
    }
    let mut gis = backend.gpu_instances(&gpu.uuid)?;
    gis.sort_by_key(|g| g.start);
    gis.into_iter()
        .map(|gi| {
            let profile =
                model.profile(gi.profile_id).map_or_else(|| format!("profile {}", gi.profile_id), |p| p.name.clone());
            Ok(InstanceView {
                device: DeviceName::mig(gpu.minor, &profile, gi.profile_id, gi.start).to_string(),
                profile,
                profile_id: gi.profile_id,
                placement: Placement { start: gi.start, size: gi.size },
                gpu_instance_id: gi.id,
                compute_instances: backend.compute_instances(&gpu.uuid, gi.id)?,
            })
        })
        .collect()
}

/// One block per GPU: a header, a row of slice numbers, a row of letters naming the instance on
/// each slice (`.` free), and a legend line per instance.
pub(super) fn picture(layout: &LayoutView, out: &mut dyn Write) -> std::io::Result<()> {
    for (n, v) in layout.gpus.iter().enumerate() {
        if n > 0 {
            writeln!(out)?;
        }
        let g = &v.gpu;
        let health = if v.lost {
            "  LOST (GPU_IS_LOST: fallen off the bus; its instances cannot be read)"
        } else if g.healthy {
            ""
        } else {
            "  UNHEALTHY"
        };
        writeln!(
            out,
            "GPU {}  minor {}  {}  {}  {}  {}{health}",
            g.index,
            g.minor,
            g.product_name,
            g.pci_bus_id,
            g.uuid,
            if g.mig_enabled { "MIG on" } else { "MIG off" }
        )?;
        if !g.mig_enabled {
            writeln!(out, "  whole GPU (MIG off): device gpu-{}", g.minor)?;
            continue;
        }
        if v.lost {
            continue;
        }
        let mut owner = vec!['.'; v.memory_slices as usize];
        for (i, inst) in v.instances.iter().enumerate() {
            let letter = char::from(b'A' + (i % 26) as u8);
            for s in inst.placement.start..inst.placement.start + inst.placement.size {
                if let Some(o) = owner.get_mut(s as usize) {
                    *o = letter;
                }
            }
        }
        let numbers: String = (0..v.memory_slices).map(|s| format!("{s:>3}")).collect();
        let cells: String = owner.iter().map(|c| format!("{c:>3}")).collect();
        writeln!(out, "  slice{numbers}")?;
        writeln!(out, "       {cells}")?;
        if v.instances.is_empty() {
            writeln!(out, "  (no MIG instances)")?;
        }
        for (i, inst) in v.instances.iter().enumerate() {
            let letter = char::from(b'A' + (i % 26) as u8);
            let cis: Vec<String> = inst.compute_instances.iter().map(|c| format!("CI {} {}", c.id, c.uuid)).collect();
            let cis = if cis.is_empty() { "no CI".to_string() } else { cis.join(", ") };
            writeln!(
                out,
                "  {letter}  {:<14} {:>2}:{:<2} GI {:<2} {cis}  {}",
                inst.profile, inst.placement.start, inst.placement.size, inst.gpu_instance_id, inst.device
            )?;
        }
    }
    Ok(())
}
