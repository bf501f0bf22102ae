//! Each GPU's index in Slurm's GRES list, and the Slurm shards it stands for.
//!
//! Slurm numbers GPUs by their position in slurmd's own list, which is in general neither the NVML
//! index nor the minor number. Sources, in order of precedence:
//! 1. an administrator's map (`--slurm-index-map`, [`indexmap`]);
//! 2. slurmd itself (`slurmd -G`, [`slurmd`]) when the binary is on the node;
//! 3. slurm.conf and gres.conf, emulating slurmd's ordering ([`order`]);
//! 4. NVML index order, which is what `AutoDetect=nvml` gives.
//!
//! A source that fails (a bad file, a GPU it names that is not here, a GPU it leaves out) is
//! skipped with a one-line reason naming the file and line, and the next one decides. Sources that
//! work but disagree are reported as conflicts; the higher one wins. One thing fails outright: an
//! administrator's map that gives two of this node's GPUs one index ([`SlurmError`]). That map is a
//! statement about this node that cannot be true, and any fallback would publish indexes the
//! administrator said are wrong.

pub mod conf;
pub mod generate;
pub mod gresconf;
pub mod hostlist;
pub mod indexmap;
pub mod order;
pub mod slurmconf;
pub mod slurmd;

use order::Record;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What stops migdra from deciding this node's Slurm indexes at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlurmError {
    /// Two of this node's GPUs have one index in the administrator's map.
    /// `first` and `second` name each GPU and the map line that placed it.
    #[error(
        "{}: GPU {first} and GPU {second} both have Slurm index {index} on this node; give each \
         GPU of a node its own index",
        map.display()
    )]
    DuplicateIndex { map: PathBuf, index: u32, first: String, second: String },
}

/// Which source decided a GPU's Slurm index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
pub enum Source {
    #[serde(rename = "admin-map")]
    AdminMap,
    #[serde(rename = "slurmd")]
    Slurmd,
    #[serde(rename = "gres.conf")]
    GresConf,
    #[serde(rename = "nvml")]
    Nvml,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AdminMap => "admin-map",
            Self::Slurmd => "slurmd",
            Self::GresConf => "gres.conf",
            Self::Nvml => "nvml",
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where to look, from the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub index_map: Option<PathBuf>,
    pub slurm_conf: PathBuf,
    /// Default: gres.conf beside slurm.conf.
    pub gres_conf: Option<PathBuf>,
    /// The slurmd binary (a bare name is looked up on PATH); `None`: never run it.
    pub slurmd: Option<PathBuf>,
    /// This node's name in Slurm (`NodeName=`).
    pub node_name: String,
    /// Shards per GPU when Slurm's configuration says nothing; `None`: the GPU's memory slices.
    pub shards_per_gpu: Option<u32>,
}

impl Settings {
    /// No Slurm on the node: NVML order, shards = memory slices.
    pub fn none(node_name: &str) -> Self {
        Self {
            index_map: None,
            slurm_conf: PathBuf::from("/nonexistent/slurm.conf"),
            gres_conf: None,
            slurmd: None,
            node_name: node_name.to_string(),
            shards_per_gpu: None,
        }
    }

    pub fn gres_conf_path(&self) -> PathBuf {
        self.gres_conf.clone().unwrap_or_else(|| self.slurm_conf.with_file_name("gres.conf"))
    }
}

/// A GPU of this node, as the sources name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpu {
    pub nvml_index: u32,
    pub minor: u32,
    pub uuid: String,
    pub pci_bus_id: String,
    pub mig_enabled: bool,
    pub memory_slices: u32,
    /// Existing MIG instances, which Slurm may list as GPUs of their own.
    pub migs: Vec<NodeMig>,
}

/// An existing MIG instance and its capability device minors (`/dev/nvidia-caps/nvidia-capN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeMig {
    pub gi: u32,
    pub ci: u32,
    pub gi_cap: u32,
    pub ci_cap: u32,
}

/// The answer for one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuSlurm {
    /// `None` when Slurm lists only the GPU's MIG instances, not the GPU.
    pub index: Option<u32>,
    pub source: Source,
    /// Shards that stand for the whole GPU.
    pub shards: u32,
    pub memory_slices: u32,
    /// MIG instances Slurm lists as GPUs of their own, with their own index.
    pub migs: Vec<MigSlurm>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MigSlurm {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub index: u32,
}

impl GpuSlurm {
    /// The Slurm index of a MIG instance, when Slurm lists it.
    pub fn mig_index(&self, gi: u32, ci: u32) -> Option<u32> {
        self.migs.iter().find(|m| m.gpu_instance_id == gi && m.compute_instance_id == ci).map(|m| m.index)
    }
}

/// Something the operator should know; warnings are conflicts and unusable sources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Note {
    pub warning: bool,
    pub message: String,
}

/// Every GPU's answer (in the order given) and how it was reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resolution {
    pub source: Source,
    /// The release `slurmd -V` reports, when slurmd was asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The rule the deciding source applied.
    pub rule: String,
    pub gpus: Vec<GpuSlurm>,
    pub notes: Vec<Note>,
}

/// One source's answer per GPU, before shards are settled.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    rule: String,
    indexes: Vec<Option<u32>>,
    shards: Vec<Option<u32>>,
    migs: Vec<Vec<MigSlurm>>,
}

/// Decide every GPU's Slurm index and shards; an unusable source only adds a note.
///
/// # Errors
/// The administrator's map gives two of these GPUs one index.
pub fn resolve(settings: &Settings, gpus: &[NodeGpu]) -> Result<Resolution, SlurmError> {
    let mut notes = Vec::new();
    let mut answers: Vec<(Source, Result<Answer, String>)> = Vec::new();
    if let Some(map) = &settings.index_map {
        match from_map(map, gpus, &mut notes)? {
            Ok(None) => notes.push(info(format!(
                "{} names no GPU of this node (an empty map, or other nodes' GPUs); the next source decides",
                map.display()
            ))),
            Ok(Some(answer)) => answers.push((Source::AdminMap, Ok(answer))),
            Err(e) => answers.push((Source::AdminMap, Err(e))),
        }
    }
    let conf_present = settings.slurm_conf.exists();
    let mut version = None;
    match settings.slurmd.as_deref().and_then(find_binary) {
        Some(bin) if conf_present => {
            let answer = slurmd::query(&bin, &settings.slurm_conf, &settings.node_name)
                .and_then(|r| from_records(&r, gpus, format!("{} -G", bin.display())));
            if answer.is_ok() {
                version = release_note(&bin, &mut notes);
            }
            answers.push((Source::Slurmd, answer));
        }
        Some(_) => {}
        None => {
            if let Some(s) = &settings.slurmd {
                notes.push(info(format!("slurmd ({}) is not on this node; not asking it", s.display())));
            }
        }
    }
    if conf_present {
        answers.push((Source::GresConf, from_conf(settings, gpus, &mut notes)));
    } else {
        notes.push(info(format!("no {}; Slurm's configuration is not on this node", settings.slurm_conf.display())));
    }
    // NVML order always answers, so it is the fallback rather than a candidate.
    let chosen = answers.iter().position(|(_, a)| a.is_ok()).unwrap_or(answers.len());
    for (i, (source, answer)) in answers.iter().enumerate() {
        if let Err(e) = answer {
            let next = answers[i + 1..].iter().find(|(_, a)| a.is_ok()).map_or("nvml", |(s, _)| s.as_str());
            let verb = if i < chosen { "falling back to" } else { "not checked against" };
            notes.push(warn(format!("{source} unusable: {e}; {verb} {next}")));
        }
    }
    let fallback = nvml_order(gpus);
    let (source, answer) = match answers.get(chosen) {
        Some((s, Ok(a))) => (*s, a),
        _ => (Source::Nvml, &fallback),
    };
    for (other, a) in &answers {
        let Ok(a) = a else { continue };
        if *other == source {
            continue;
        }
        for (g, (mine, theirs)) in gpus.iter().zip(answer.indexes.iter().zip(&a.indexes)) {
            if mine != theirs {
                notes.push(warn(format!(
                    "CONFLICT: {source} gives GPU {} (minor {}) Slurm index {}, {other} gives {}; using {source}",
                    g.uuid,
                    g.minor,
                    show(*mine),
                    show(*theirs)
                )));
            }
        }
    }
    for (g, (index, migs)) in gpus.iter().zip(answer.indexes.iter().zip(&answer.migs)) {
        if index.is_none() && migs.is_empty() {
            notes.push(info(format!(
                "GPU {} (minor {}, MIG on) has no Slurm index: {source} lists neither it nor its \
                 MIG instances, so Slurm does not schedule it",
                g.uuid, g.minor
            )));
        }
    }
    let shards = settle_shards(settings, gpus, &answers, &mut notes);
    Ok(Resolution {
        source,
        version,
        rule: answer.rule.clone(),
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, g)| GpuSlurm {
                index: answer.indexes[i],
                source,
                shards: shards[i],
                memory_slices: g.memory_slices,
                migs: answer.migs[i].clone(),
            })
            .collect(),
        notes,
    })
}

/// Ask slurmd its release: releases migdra was not checked against get one warning that says what
/// it assumes. `None` when slurmd does not say (the note gives the reason).
fn release_note(bin: &Path, notes: &mut Vec<Note>) -> Option<String> {
    let (oldest, newest) = slurmd::Release::CHECKED;
    match slurmd::version(bin) {
        Ok(release) if release.is_known() => Some(release.to_string()),
        Ok(release) => {
            notes.push(warn(format!(
                "Slurm {release} ({} -V) is not a release migdra was checked against ({}.{:02} to \
                 {}.{:02}); assuming it numbers GPUs as those do: slurm.conf's Gres= type order, \
                 then gres.conf's file order",
                bin.display(),
                oldest.major,
                oldest.minor,
                newest.major,
                newest.minor
            )));
            Some(release.to_string())
        }
        Err(e) => {
            notes.push(info(format!("Slurm's release unknown: {e}")));
            None
        }
    }
}

fn show(i: Option<u32>) -> String {
    i.map_or_else(|| "none".into(), |i| i.to_string())
}

fn info(message: String) -> Note {
    Note { warning: false, message }
}

fn warn(message: String) -> Note {
    Note { warning: true, message }
}

/// Shards per GPU: what Slurm's configuration says (slurmd, else gres.conf), else the flag, else
/// the GPU's memory slices.
fn settle_shards(
    settings: &Settings,
    gpus: &[NodeGpu],
    answers: &[(Source, Result<Answer, String>)],
    notes: &mut Vec<Note>,
) -> Vec<u32> {
    let from_slurm = answers
        .iter()
        .filter(|(s, _)| matches!(s, Source::Slurmd | Source::GresConf))
        .find_map(|(s, a)| a.as_ref().ok().filter(|a| a.shards.iter().any(Option::is_some)).map(|a| (*s, a)));
    gpus.iter()
        .enumerate()
        .map(|(i, g)| {
            let fallback = settings.shards_per_gpu.unwrap_or(g.memory_slices);
            match from_slurm.and_then(|(s, a)| a.shards[i].map(|n| (s, n))) {
                Some((s, n)) => {
                    if settings.shards_per_gpu.is_some_and(|f| f != n) {
                        notes.push(warn(format!(
                            "CONFLICT: --shards-per-gpu {fallback} but {s} gives GPU {} (minor {}) \
                             {n} shards; using {n}",
                            g.uuid, g.minor
                        )));
                    }
                    n
                }
                None => fallback,
            }
        })
        .collect()
}

fn nvml_order(gpus: &[NodeGpu]) -> Answer {
    Answer {
        rule: "NVML index order (what AutoDetect=nvml gives for GPUs without MIG)".into(),
        indexes: gpus.iter().map(|g| Some(g.nvml_index)).collect(),
        shards: vec![None; gpus.len()],
        migs: vec![Vec::new(); gpus.len()],
    }
}

/// `Ok(Ok(None))`: the map has nothing for this node's GPUs; `Ok(Err)`: the map is unusable and
/// the next source decides; `Err`: the map contradicts itself on this node.
fn from_map(
    path: &Path,
    gpus: &[NodeGpu],
    notes: &mut Vec<Note>,
) -> Result<Result<Option<Answer>, String>, SlurmError> {
    let entries = match indexmap::read(path) {
        Ok(e) => e,
        Err(e) => return Ok(Err(e.to_string())),
    };
    // By UUID first: a UUID names one GPU in the cluster, a PCI bus ID one slot on every node.
    let mut chosen: Vec<Option<&indexmap::Entry>> = vec![None; gpus.len()];
    for (i, g) in gpus.iter().enumerate() {
        let by_uuid = entries.iter().find(|e| matches!(e.gpu, indexmap::GpuKey::Uuid(_)) && e.gpu.matches(&g.uuid, ""));
        let by_pci =
            entries.iter().find(|e| matches!(e.gpu, indexmap::GpuKey::PciBusId(_)) && e.gpu.matches("", &g.pci_bus_id));
        if let (Some(u), Some(p)) = (by_uuid, by_pci)
            && u.index != p.index
        {
            notes.push(warn(format!(
                "{}: {} maps GPU {} to {}, but {} ({}) maps its bus ID to {}; using the UUID's",
                u.at, u.gpu, g.uuid, u.index, p.gpu, p.at, p.index
            )));
        }
        chosen[i] = by_uuid.or(by_pci);
    }
    if chosen.iter().all(Option::is_none) {
        return Ok(Ok(None));
    }
    // Duplicates first: they are fatal, a missing GPU only makes the map unusable.
    let named = |i: usize, e: &indexmap::Entry| {
        let g = &gpus[i];
        match &e.gpu {
            indexmap::GpuKey::Uuid(_) => format!("{} (line {})", g.uuid, e.at.line),
            key => format!("{} (as {key}, line {})", g.uuid, e.at.line),
        }
    };
    for (i, e) in chosen.iter().enumerate() {
        let Some(e) = *e else { continue };
        if let Some((j, other)) =
            chosen[..i].iter().enumerate().find_map(|(j, o)| o.filter(|o| o.index == e.index).map(|o| (j, o)))
        {
            let (first, second) = if other.at.line <= e.at.line { ((j, other), (i, e)) } else { ((i, e), (j, other)) };
            return Err(SlurmError::DuplicateIndex {
                map: path.to_path_buf(),
                index: e.index,
                first: named(first.0, first.1),
                second: named(second.0, second.1),
            });
        }
    }
    // A MIG GPU the map leaves out has no index, as when Slurm's files leave it out (a static-MIG
    // GPU Slurm does not schedule); any other GPU left out makes the map unusable.
    if let Some(i) = chosen.iter().zip(gpus).position(|(e, g)| e.is_none() && !g.mig_enabled) {
        let g = &gpus[i];
        return Ok(Err(format!("{} does not map GPU {} ({})", path.display(), g.uuid, g.pci_bus_id)));
    }
    Ok(Ok(Some(Answer {
        rule: format!("administrator's map {}", path.display()),
        indexes: chosen.iter().map(|e| e.map(|e| e.index)).collect(),
        shards: vec![None; gpus.len()],
        migs: vec![Vec::new(); gpus.len()],
    })))
}

fn from_conf(settings: &Settings, gpus: &[NodeGpu], notes: &mut Vec<Note>) -> Result<Answer, String> {
    let slurm = conf::read(&settings.slurm_conf).map_err(|e| e.to_string())?;
    let node = slurmconf::node_gres(&slurm, &settings.node_name).map_err(|e| e.to_string())?;
    let gres_path = settings.gres_conf_path();
    let gres = conf::read(&gres_path).map_err(|e| e.to_string())?;
    let gres = gresconf::parse(&gres, &settings.node_name).map_err(|e| e.to_string())?;
    if gres.autodetects() {
        return Ok(autodetect_order(gpus));
    }
    let emulated = order::emulate(&node, &gres).map_err(|e| e.to_string())?;
    notes.extend(emulated.notes.iter().map(|n| info(format!("gres.conf emulation: {n}"))));
    from_records(&emulated.records, gpus, format!("{} emulated from {}", order::RULE, gres_path.display()))
}

/// `AutoDetect=nvml`: GPUs in NVML order, and MIG instances (which have no NVML links) after all
/// of them, by parent minor then capability minors. Read from Slurm's source (`gpu_nvml.c`), not
/// observed: Debian's Slurm has no NVML plugin.
fn autodetect_order(gpus: &[NodeGpu]) -> Answer {
    let mut order: Vec<&NodeGpu> = gpus.iter().filter(|g| !g.mig_enabled).collect();
    order.sort_by_key(|g| g.nvml_index);
    let mut indexes = vec![None; gpus.len()];
    let mut next = 0;
    for g in order {
        let i = gpus.iter().position(|x| x.uuid == g.uuid).unwrap_or_default();
        indexes[i] = Some(next);
        next += 1;
    }
    let mut migs: Vec<(u32, usize, NodeMig)> = gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| g.mig_enabled)
        .flat_map(|(i, g)| g.migs.iter().map(move |m| (g.minor, i, *m)))
        .collect();
    migs.sort_by_key(|(minor, _, m)| (*minor, m.gi_cap, m.ci_cap));
    let mut per_gpu = vec![Vec::new(); gpus.len()];
    for (_, i, m) in migs {
        per_gpu[i].push(MigSlurm { gpu_instance_id: m.gi, compute_instance_id: m.ci, index: next });
        next += 1;
    }
    Answer {
        rule: "gres.conf AutoDetect=nvml: NVML index order, MIG instances after every whole GPU \
               (read from Slurm's source, not observed)"
            .into(),
        indexes,
        shards: vec![None; gpus.len()],
        migs: per_gpu,
    }
}

/// What a GRES file is: a GPU (`/dev/nvidiaN`) or a MIG capability (`/dev/nvidia-caps/nvidia-capN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeviceFile {
    Gpu(u32),
    Cap(u32),
}

/// By name, as slurmd reads it; a file named otherwise is a character device whose minor decides.
fn device_file(path: &Path) -> Option<DeviceFile> {
    let name = path.file_name()?.to_str()?;
    let digits = |p: &str| name.strip_prefix(p).filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()));
    if let Some(n) = digits("nvidia-cap") {
        return n.parse().ok().map(DeviceFile::Cap);
    }
    if let Some(n) = digits("nvidia") {
        return n.parse().ok().map(DeviceFile::Gpu);
    }
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok().filter(|m| m.file_type().is_char_device())?;
    let rdev = meta.rdev();
    Some(DeviceFile::Gpu((((rdev >> 12) & 0xffff_ff00) | (rdev & 0xff)) as u32))
}

/// Match Slurm's list to this node's GPUs by device file.
fn from_records(records: &[Record], gpus: &[NodeGpu], rule: String) -> Result<Answer, String> {
    let mut indexes = vec![None; gpus.len()];
    let mut migs = vec![Vec::new(); gpus.len()];
    let minors = || {
        let m: Vec<String> = gpus.iter().map(|g| g.minor.to_string()).collect();
        format!("GPU minors here: {}", m.join(", "))
    };
    for (pos, r) in records.iter().enumerate() {
        let pos = pos as u32;
        let at = r.at.as_ref().map_or_else(String::new, |a| format!("{a}: "));
        let mut parent = None;
        let mut caps = Vec::new();
        for f in &r.files {
            match device_file(f) {
                Some(DeviceFile::Gpu(m)) => parent = Some((m, f)),
                Some(DeviceFile::Cap(c)) => caps.push(c),
                None => return Err(format!("{at}{} (Slurm index {pos}) is not an NVIDIA device file", f.display())),
            }
        }
        let Some((minor, file)) = parent else {
            return Err(format!("{at}Slurm index {pos} has no /dev/nvidiaN file"));
        };
        let g = gpus.iter().position(|g| g.minor == minor).ok_or_else(|| {
            format!("{at}{} (Slurm index {pos}) is not a GPU on this node; {}", file.display(), minors())
        })?;
        if caps.is_empty() {
            if let Some(prev) = indexes[g] {
                return Err(format!("{at}{} is listed twice (Slurm indexes {prev} and {pos})", file.display()));
            }
            indexes[g] = Some(pos);
            continue;
        }
        let m =
            gpus[g].migs.iter().find(|m| caps.contains(&m.gi_cap) && caps.contains(&m.ci_cap)).ok_or_else(|| {
                let c: Vec<String> = caps.iter().map(|c| format!("nvidia-cap{c}")).collect();
                format!(
                    "{at}Slurm index {pos} names {} on GPU minor {minor}, which match no MIG instance there",
                    c.join(",")
                )
            })?;
        migs[g].push(MigSlurm { gpu_instance_id: m.gi, compute_instance_id: m.ci, index: pos });
    }
    // A MIG GPU may be left out on purpose: a static-MIG GPU that a File-based gres.conf cannot
    // describe (`migdra slurm-conf` leaves it out). Slurm then does not schedule it: no index.
    if let Some(g) = gpus
        .iter()
        .enumerate()
        .find(|(i, g)| !g.mig_enabled && indexes[*i].is_none() && migs[*i].is_empty())
        .map(|(_, g)| g)
    {
        return Err(format!("GPU {} (/dev/nvidia{}) is not in Slurm's GPU list", g.uuid, g.minor));
    }
    Ok(Answer { rule, indexes, shards: records_shards(records, gpus), migs })
}

/// Each GPU's shards from the record of its own device file.
fn records_shards(records: &[Record], gpus: &[NodeGpu]) -> Vec<Option<u32>> {
    gpus.iter()
        .map(|g| {
            records
                .iter()
                .find(|r| r.files.len() == 1 && device_file(&r.files[0]) == Some(DeviceFile::Gpu(g.minor)))
                .and_then(|r| r.shards)
        })
        .collect()
}

/// A bare name is looked up on PATH, like a shell would.
fn find_binary(name: &Path) -> Option<PathBuf> {
    if name.components().count() > 1 {
        return name.is_file().then(|| name.to_path_buf());
    }
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests;
