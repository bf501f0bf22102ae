//! The Slurm configuration that matches what migdra publishes (`migdra slurm-conf`): slurm.conf's
//! `GresTypes=` and the node's `Gres=`, and gres.conf's records, for a hybrid node where Slurm
//! schedules whole GPUs and shards while Kubernetes gets MIG instances through migdra.
//!
//! Two promises, both checked against the real slurmd by `tests/slurm.rs`:
//! - **Index.** slurmd numbers GPUs type by type in slurm.conf's `Gres=` order, then in gres.conf
//!   order within a type (as 22.05 and 26.05 order them, [`super::order`]). The GPUs are written
//!   in the order of the index migdra wants for them (the administrator's map, else NVML order,
//!   which is what `AutoDetect=nvml` would give), one `File=` each, types in order of first use,
//!   so Slurm's index is the GPU's position, and migdra reading these files back computes the
//!   same.
//! - **Shards.** One `Name=shard Count=S File=` record per GPU, S being exactly the `slurmShards`
//!   migdra publishes for the whole GPU, so a Slurm job of S shards stands for one whole GPU and
//!   a MIG profile's shards for its part.
//!
//! A static-MIG GPU is left out, with a comment: Slurm sees MIG instances only through
//! `AutoDetect=nvml` (docs/facts/slurm-bridge.md §3.2), which a File-based gres.conf cannot mix
//! with, and a whole-GPU record would let a native job take a GPU whose instances Kubernetes uses.
//! Slurm then does not schedule that GPU, and the GPUs after it move up one index.
//!
//! Pure: no I/O; the caller says which GPUs and which indexes.

use serde::Serialize;
use std::path::{Path, PathBuf};

/// What makes a configuration impossible to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GenerateError {
    #[error("GRES type {0:?}: {TYPE_RULE}")]
    BadType(String),
    #[error("--dev-root {0:?}: {DEV_ROOT_RULE}")]
    BadDevRoot(String),
    #[error(
        "GPUs of type {gres_type} ({first}, {second}) are not next to each other in Slurm index \
         order ({between} of type {other} is between them): slurmd numbers GPUs type by type, so \
         these indexes cannot be met; give every GPU one type with --gres-type NAME"
    )]
    TypesInterleave { gres_type: String, first: String, second: String, between: String, other: String },
    #[error(
        "the Slurm index map gives GPU {uuid} index {wanted}, but Slurm would number it {position} \
         (indexes count from 0 over the GPUs Slurm lists, in the map's order{left_out}); renumber the map"
    )]
    MapDisagrees { uuid: String, wanted: u32, position: u32, left_out: String },
    #[error("no GPU Slurm can schedule on this node ({0})")]
    NothingToList(String),
}

/// What a Slurm GRES type may be here. slurmd's parser takes more (`H100` and `100g` pass
/// `slurmd -G` on 22.05, observed), but `:`, `,`, `=`, `#` and blanks break slurm.conf's `Gres=`
/// and gres.conf, a leading digit looks like a count in a job's `--gres=gpu:...`, and one
/// lowercase spelling keeps slurm.conf, gres.conf and users' requests the same.
pub const TYPE_RULE: &str = "a Slurm GRES type must start with a lowercase letter and hold only \
                             lowercase letters, digits, '_', '-' and '.', e.g. h100";

/// What `File=` may start with: a `#` starts a comment, blanks split words, `[`, `]` and `,` are
/// hostlist syntax, `=` and quotes end the value.
pub const DEV_ROOT_RULE: &str =
    "the device directory must be an absolute path without blanks or any of # , [ ] = \" ' \\";

/// Whether Slurm takes `name` as a GRES type (see [`TYPE_RULE`]).
pub fn check_type(name: &str) -> Result<(), GenerateError> {
    let mut chars = name.chars();
    let ok = chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-' | '.'));
    if ok { Ok(()) } else { Err(GenerateError::BadType(name.to_string())) }
}

/// Whether `dir` can prefix `File=` values (see [`DEV_ROOT_RULE`]).
pub fn check_dev_root(dir: &Path) -> Result<(), GenerateError> {
    let s = dir.to_string_lossy();
    let bad = |c: char| c.is_whitespace() || matches!(c, '#' | ',' | '[' | ']' | '=' | '"' | '\'' | '\\');
    if dir.is_absolute() && !s.contains(bad) { Ok(()) } else { Err(GenerateError::BadDevRoot(s.into_owned())) }
}

/// A model's Slurm type: the catalog key without its memory size, `-` as `_` (`h100-80gb` →
/// `h100`, `rtx-pro-6000` → `rtx_pro_6000`), the name users write in `--gres=gpu:h100:1`.
pub fn default_type(model_key: &str) -> String {
    let key = model_key.to_ascii_lowercase();
    let base = match key.rsplit_once('-') {
        Some((base, size)) if size.ends_with("gb") && size[..size.len() - 2].bytes().all(|b| b.is_ascii_digit()) => {
            base.to_string()
        }
        _ => key,
    };
    base.replace('-', "_")
}

/// One GPU of the node, as the configuration needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuIn {
    pub nvml_index: u32,
    pub minor: u32,
    pub uuid: String,
    /// The catalog key, e.g. `h100-80gb`.
    pub model: String,
    /// MIG on with an administrator's instances: left out (see the module doc).
    pub static_mig: bool,
    /// The index migdra wants: the administrator's map, else the NVML index.
    pub wanted: u32,
    /// `slurmShards` of the whole GPU.
    pub shards: u32,
}

/// The node and the choices of the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The node's name in slurm.conf.
    pub node: String,
    /// Where `nvidia<minor>` is, `/dev` on a real node.
    pub dev_root: PathBuf,
    /// One type for every GPU; `None`: [`default_type`] of each GPU's model.
    pub gres_type: Option<String>,
    /// The wanted indexes come from an administrator's map, which must then equal the positions.
    pub from_map: bool,
}

/// The configuration, as lines to paste and as records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    pub node_name: String,
    /// The node's `Gres=` value, e.g. `gpu:h100:8,shard:64`.
    pub gres: String,
    /// slurm.conf: `GresTypes=gpu,shard` (once per cluster) and `NodeName=<node> Gres=…`.
    pub slurm_conf: Vec<String>,
    /// gres.conf, comments included: the whole file for this node.
    pub gres_conf: Vec<String>,
    /// gres.conf's records in order: the GPUs, then their shards.
    pub records: Vec<Record>,
    /// Every GPU of the node in NVML order, with what Slurm will call it.
    pub gpus: Vec<GpuOut>,
    /// What the administrator should know (also in gres.conf as comments).
    pub notes: Vec<String>,
}

/// One gres.conf record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// `gpu` or `shard`.
    pub name: &'static str,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub gres_type: Option<String>,
    pub count: u32,
    pub file: PathBuf,
}

/// A GPU and its place in Slurm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuOut {
    /// NVML index.
    pub index: u32,
    pub minor: u32,
    pub uuid: String,
    pub file: PathBuf,
    /// `None`: left out, Slurm does not schedule it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gres_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_gpu_index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slurm_shards: Option<u32>,
    /// Why it is left out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left_out: Option<String>,
}

/// Write the configuration for `gpus` (any order).
///
/// # Errors
/// A bad type or device directory; types that slurmd would number in another order; a map whose
/// indexes are not the positions Slurm gives; no GPU Slurm can schedule.
pub fn generate(gpus: &[GpuIn], req: &Request) -> Result<Config, GenerateError> {
    check_dev_root(&req.dev_root)?;
    let type_of = |g: &GpuIn| req.gres_type.clone().unwrap_or_else(|| default_type(&g.model));
    for g in gpus {
        check_type(&type_of(g))?;
    }
    let file = |g: &GpuIn| req.dev_root.join(format!("nvidia{}", g.minor));
    let mut listed: Vec<&GpuIn> = gpus.iter().filter(|g| !g.static_mig).collect();
    listed.sort_by_key(|g| (g.wanted, g.nvml_index));
    if listed.is_empty() {
        let why = if gpus.is_empty() { "it has none" } else { "every GPU is in static MIG mode" };
        return Err(GenerateError::NothingToList(why.into()));
    }
    let left_out: Vec<&GpuIn> = gpus.iter().filter(|g| g.static_mig).collect();
    let mut notes = Vec::new();
    for (pos, g) in listed.iter().enumerate() {
        let pos = pos as u32;
        if pos == g.wanted {
            continue;
        }
        if req.from_map {
            let left: Vec<&str> = left_out.iter().map(|g| g.uuid.as_str()).collect();
            return Err(GenerateError::MapDisagrees {
                uuid: g.uuid.clone(),
                wanted: g.wanted,
                position: pos,
                left_out: if left.is_empty() {
                    String::new()
                } else {
                    format!("; static-MIG {} left out", left.join(", "))
                },
            });
        }
        notes.push(format!(
            "GPU {} (NVML index {}) gets Slurm index {pos}, not {}, as static-MIG GPUs before it are left out",
            g.uuid, g.nvml_index, g.wanted
        ));
    }
    // slurmd's order is type by type, so each type's GPUs must be one run of the list.
    let mut types: Vec<(String, u32)> = Vec::new();
    for (pos, g) in listed.iter().enumerate() {
        let t = type_of(g);
        let last = types.last().is_some_and(|(x, _)| *x == t);
        match types.iter_mut().find(|(x, _)| *x == t) {
            Some((_, n)) if last => *n += 1,
            Some(_) => {
                let first = listed[..pos].iter().find(|x| type_of(x) == t).map_or(0, |x| x.nvml_index);
                let between = listed[..pos].iter().rev().find(|x| type_of(x) != t).copied().unwrap_or(g);
                return Err(GenerateError::TypesInterleave {
                    gres_type: t,
                    first: format!("NVML index {first}"),
                    second: format!("NVML index {}", g.nvml_index),
                    between: format!("NVML index {}", between.nvml_index),
                    other: type_of(between),
                });
            }
            None => types.push((t, 1)),
        }
    }
    let total: u32 = listed.iter().map(|g| g.shards).sum();
    let mut gres: Vec<String> = types.iter().map(|(t, n)| format!("gpu:{t}:{n}")).collect();
    gres.push(format!("shard:{total}"));
    let gres = gres.join(",");

    let node = &req.node;
    let mut records = Vec::new();
    let mut lines = vec![
        format!("# gres.conf for Slurm node {node}, written by `migdra slurm-conf`: one GPU record per GPU in"),
        "# Slurm index order, then each GPU's shards (as many as migdra's slurmShards for the whole GPU).".into(),
        format!("NodeName={node} AutoDetect=off"),
    ];
    for (pos, g) in listed.iter().enumerate() {
        let t = type_of(g);
        lines.push(format!(
            "NodeName={node} Name=gpu Type={t} File={} # Slurm index {pos}: NVML index {}, {}",
            file(g).display(),
            g.nvml_index,
            g.uuid
        ));
        records.push(Record { name: "gpu", gres_type: Some(t), count: 1, file: file(g) });
    }
    for g in &listed {
        lines.push(format!("NodeName={node} Name=shard Count={} File={}", g.shards, file(g).display()));
        records.push(Record { name: "shard", gres_type: None, count: g.shards, file: file(g) });
    }
    const STATIC: &str = "in static MIG mode: Slurm sees MIG instances only through \
                          AutoDetect=nvml, which these File= records exclude, and a whole-GPU \
                          record would let a native job take the GPU whose instances Kubernetes \
                          uses; Slurm does not schedule it";
    for g in &left_out {
        notes.push(format!(
            "GPU {} (NVML index {}, {}) is left out: {STATIC}",
            g.uuid,
            g.nvml_index,
            file(g).display()
        ));
    }
    lines.extend(notes.iter().map(|n| format!("# {n}")));

    let mut out: Vec<GpuOut> = gpus
        .iter()
        .map(|g| {
            let pos = listed.iter().position(|x| x.uuid == g.uuid).map(|p| p as u32);
            GpuOut {
                index: g.nvml_index,
                minor: g.minor,
                uuid: g.uuid.clone(),
                file: file(g),
                gres_type: pos.map(|_| type_of(g)),
                slurm_gpu_index: pos,
                slurm_shards: pos.map(|_| g.shards),
                left_out: pos.is_none().then(|| STATIC.to_string()),
            }
        })
        .collect();
    out.sort_by_key(|g| g.index);
    Ok(Config {
        node_name: node.clone(),
        slurm_conf: vec!["GresTypes=gpu,shard".into(), format!("NodeName={node} Gres={gres}")],
        gres,
        gres_conf: lines,
        records,
        gpus: out,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Source, conf, gresconf, order, slurmconf};
    use super::*;

    /// Minors that follow neither NVML order nor each other, as on real nodes.
    fn gpus(n: u32) -> Vec<GpuIn> {
        (0..n)
            .map(|i| GpuIn {
                nvml_index: i,
                minor: [3, 0, 12, 7, 1, 10, 2, 11][i as usize % 8] + 16 * (i / 8),
                uuid: format!("GPU-{i:08}"),
                model: "h100-80gb".into(),
                static_mig: false,
                wanted: i,
                shards: 8,
            })
            .collect()
    }

    fn req() -> Request {
        Request { node: "vm".into(), dev_root: "/dev".into(), gres_type: None, from_map: false }
    }

    /// The Slurm index each GPU gets from the written files, by migdra's emulation of slurmd.
    fn read_back(c: &Config, gpus: &[GpuIn]) -> Vec<(Option<u32>, Option<u32>)> {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("slurm.conf"), format!("{}\n", c.slurm_conf.join("\n"))).unwrap();
        std::fs::write(d.path().join("gres.conf"), format!("{}\n", c.gres_conf.join("\n"))).unwrap();
        let node = slurmconf::node_gres(&conf::read(&d.path().join("slurm.conf")).unwrap(), "vm").unwrap();
        let gres = gresconf::parse(&conf::read(&d.path().join("gres.conf")).unwrap(), "vm").unwrap();
        let e = order::emulate(&node, &gres).unwrap();
        assert!(e.notes.is_empty(), "{:?}", e.notes);
        let mut settings = super::super::Settings::none("vm");
        settings.slurm_conf = d.path().join("slurm.conf");
        let node_gpus: Vec<super::super::NodeGpu> = gpus
            .iter()
            .map(|g| super::super::NodeGpu {
                nvml_index: g.nvml_index,
                minor: g.minor,
                uuid: g.uuid.clone(),
                pci_bus_id: String::new(),
                mig_enabled: g.static_mig,
                memory_slices: 8,
                migs: Vec::new(),
            })
            .collect();
        let r = super::super::resolve(&settings, &node_gpus).unwrap();
        assert_eq!(r.source, Source::GresConf, "{:?}", r.notes);
        assert!(r.notes.iter().all(|n| !n.warning), "{:?}", r.notes);
        r.gpus.iter().map(|g| (g.index, g.index.map(|_| g.shards))).collect()
    }

    #[test]
    fn indexes_and_shards_read_back_as_written() {
        let g = gpus(12);
        let c = generate(&g, &req()).unwrap();
        assert_eq!(c.gres, "gpu:h100:12,shard:96");
        assert_eq!(c.slurm_conf, ["GresTypes=gpu,shard", "NodeName=vm Gres=gpu:h100:12,shard:96"]);
        assert_eq!(
            c.gres_conf[3],
            "NodeName=vm Name=gpu Type=h100 File=/dev/nvidia3 # Slurm index 0: NVML index 0, GPU-00000000"
        );
        assert_eq!(c.gres_conf[15], "NodeName=vm Name=shard Count=8 File=/dev/nvidia3");
        let back = read_back(&c, &g);
        assert_eq!(back, (0..12).map(|i| (Some(i), Some(8))).collect::<Vec<_>>());
        assert!(c.gpus.iter().all(|o| o.slurm_gpu_index == Some(o.index)));
    }

    /// An administrator's map orders the records; shards may differ per GPU.
    #[test]
    fn a_map_orders_the_records() {
        let mut g = gpus(4);
        for (x, w) in g.iter_mut().zip([2, 0, 3, 1]) {
            x.wanted = w;
            x.shards = 4 + w;
        }
        let c = generate(&g, &Request { from_map: true, ..req() }).unwrap();
        assert_eq!(c.gres, "gpu:h100:4,shard:22");
        assert_eq!(read_back(&c, &g), [(Some(2), Some(6)), (Some(0), Some(4)), (Some(3), Some(7)), (Some(1), Some(5))]);
        // A map with a gap cannot be met.
        g[2].wanted = 5;
        let e = generate(&g, &Request { from_map: true, ..req() }).unwrap_err().to_string();
        assert_eq!(
            e,
            "the Slurm index map gives GPU GPU-00000002 index 5, but Slurm would number it 3 \
             (indexes count from 0 over the GPUs Slurm lists, in the map's order); renumber the map"
        );
    }

    #[test]
    fn a_static_gpu_is_left_out_and_the_next_move_up() {
        let mut g = gpus(4);
        g[1].static_mig = true;
        let c = generate(&g, &req()).unwrap();
        assert_eq!(c.gres, "gpu:h100:3,shard:24");
        assert!(!c.gres_conf.iter().any(|l| l.contains("File=/dev/nvidia0 ") || l.ends_with("File=/dev/nvidia0")));
        assert!(
            c.gres_conf
                .iter()
                .any(|l| l
                    .starts_with("# GPU GPU-00000001 (NVML index 1, /dev/nvidia0) is left out: in static MIG mode")),
            "{:?}",
            c.gres_conf
        );
        assert_eq!(read_back(&c, &g), [(Some(0), Some(8)), (None, None), (Some(1), Some(8)), (Some(2), Some(8))]);
        assert!(c.notes[0].contains("GPU-00000002 (NVML index 2) gets Slurm index 1, not 2"), "{:?}", c.notes);
        let e = generate(&g, &Request { from_map: true, ..req() }).unwrap_err().to_string();
        assert!(
            e.contains("GPU-00000002 index 2, but Slurm would number it 1")
                && e.contains("static-MIG GPU-00000001 left out"),
            "{e}"
        );
        for x in &mut g {
            x.static_mig = true;
        }
        assert_eq!(
            generate(&g, &req()).unwrap_err(),
            GenerateError::NothingToList("every GPU is in static MIG mode".into())
        );
    }

    #[test]
    fn types_follow_the_models_and_must_not_interleave() {
        let mut g = gpus(4);
        g[2].model = "a100-80gb".into();
        g[3].model = "a100-40gb".into();
        let c = generate(&g, &req()).unwrap();
        assert_eq!(c.gres, "gpu:h100:2,gpu:a100:2,shard:32");
        assert_eq!(read_back(&c, &g), (0..4).map(|i| (Some(i), Some(8))).collect::<Vec<_>>());
        g[1].model = "a100-40gb".into();
        g[2].model = "h100-80gb".into();
        let e = generate(&g, &req()).unwrap_err().to_string();
        assert_eq!(
            e,
            "GPUs of type h100 (NVML index 0, NVML index 2) are not next to each other in Slurm \
             index order (NVML index 1 of type a100 is between them): slurmd numbers GPUs type by \
             type, so these indexes cannot be met; give every GPU one type with --gres-type NAME"
        );
        let c = generate(&g, &Request { gres_type: Some("hopper.x-1".into()), ..req() }).unwrap();
        assert_eq!(c.gres, "gpu:hopper.x-1:4,shard:32");
    }

    #[test]
    fn names_slurm_would_refuse() {
        for t in ["H100", "1g", "", "a:b", "a b", "a,b", "_x", "a=b", "a#b"] {
            let e = check_type(t).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("GRES type {t:?}: a Slurm GRES type must start with a lowercase letter")),
                "{e}"
            );
        }
        for t in ["h100", "a100_3g.40gb", "rtx_pro_6000", "gpu-nvidia"] {
            check_type(t).unwrap();
        }
        for d in ["dev", "/my dev", "/d#", "/d[0]", "/a,b"] {
            let e = generate(&gpus(1), &Request { dev_root: d.into(), ..req() }).unwrap_err().to_string();
            assert!(e.starts_with(&format!("--dev-root {d:?}: the device directory must be an absolute path")), "{e}");
        }
    }

    #[test]
    fn default_types_from_the_catalog() {
        for (key, want) in [
            ("h100-80gb", "h100"),
            ("a30-24gb", "a30"),
            ("gh200-144gb", "gh200"),
            ("rtx-pro-6000", "rtx_pro_6000"),
            ("b200-180gb", "b200"),
        ] {
            assert_eq!(default_type(key), want);
        }
        for m in crate::mig::catalog::models() {
            check_type(&default_type(&m.key)).unwrap();
        }
    }
}
