//! An administrator's GPU → Slurm index map, the first source of truth: a ConfigMap key mounted as
//! a file (`--slurm-index-map`), one `GPU: index` per line, the GPU by UUID or PCI bus ID:
//!
//! ```yaml
//! # node gpu-node-7
//! GPU-5d4a1c1e-8b0f-4bb2-9f3e-0c2d6c1e7a10: 0
//! "0000:3b:00.0": 1
//! ```
//!
//! Only this flat YAML subset is read (plus `{}`, an empty map), so every error can name its line.
//! One map may serve every node of a cluster: entries for GPUs that are not on a node are ignored
//! there, so an index may repeat across nodes but not among one node's GPUs.

use super::conf::{ConfError, Location};
use std::path::Path;

/// One entry: the GPU as written (normalised), its index, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub gpu: GpuKey,
    pub index: u32,
    pub at: Location,
}

/// How an entry names its GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuKey {
    Uuid(String),
    /// `dddd:bb:dd.f`, lower case, four-digit domain.
    PciBusId(String),
}

impl GpuKey {
    fn parse(s: &str) -> Option<Self> {
        // `get`, not `[..4]`: a key may start with a multi-byte character (found by tests/fuzz.rs).
        if s.len() > 4 && s.get(..4).is_some_and(|p| p.eq_ignore_ascii_case("GPU-")) {
            return Some(Self::Uuid(format!("GPU-{}", s[4..].to_ascii_lowercase())));
        }
        crate::pci::bus_id(s).map(Self::PciBusId)
    }

    /// Whether this names the GPU with `uuid` and `pci_bus_id` (as NVML reports them).
    pub fn matches(&self, uuid: &str, pci_bus_id: &str) -> bool {
        match self {
            Self::Uuid(u) => u.eq_ignore_ascii_case(uuid),
            Self::PciBusId(p) => crate::pci::bus_id(pci_bus_id).as_deref() == Some(p),
        }
    }
}

impl std::fmt::Display for GpuKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Uuid(u) | Self::PciBusId(u) => f.write_str(u),
        }
    }
}

/// Read the map file.
///
/// # Errors
/// The file cannot be read; a line is not `GPU: index`; a GPU is neither a UUID (`GPU-...`) nor a
/// PCI bus ID; an index is not a non-negative integer; a GPU appears twice.
pub fn read(path: &Path) -> Result<Vec<Entry>, ConfError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfError {
        at: Location { file: path.to_path_buf(), line: 0 },
        message: format!("cannot read the Slurm index map: {e}"),
    })?;
    parse(&text, path)
}

pub fn parse(text: &str, path: &Path) -> Result<Vec<Entry>, ConfError> {
    let mut out: Vec<Entry> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let at = Location { file: path.to_path_buf(), line: i + 1 };
        let err = |message: String| ConfError { at: at.clone(), message };
        let line = raw.split(" #").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('#') || line == "---" || line == "{}" {
            continue;
        }
        let (key, value) = line.rsplit_once(':').ok_or_else(|| err(format!("{line:?} is not `GPU: index`")))?;
        let key = key.trim().trim_matches(|c| c == '"' || c == '\'');
        let value = value.trim().trim_matches(|c| c == '"' || c == '\'');
        let gpu = GpuKey::parse(key)
            .ok_or_else(|| err(format!("{key:?} is neither a GPU UUID (GPU-...) nor a PCI bus ID (0000:3b:00.0)")))?;
        let index: u32 =
            value.parse().map_err(|_| err(format!("index {value:?} of {key} is not a non-negative integer")))?;
        if let Some(prev) = out.iter().find(|e| e.gpu == gpu) {
            return Err(err(format!("{gpu} is mapped twice (also at line {})", prev.at.line)));
        }
        out.push(Entry { gpu, index, at });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Vec<Entry>, String> {
        parse(text, Path::new("map.yaml")).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_uuids_and_bus_ids() {
        assert_eq!(p("{}\n").unwrap(), []);
        let m = p("# comment\n---\nGPU-ABC-1: 3\n\"00000000:3B:00.0\": 0 # trailing\n3c:00.0: '1'\n").unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].gpu, GpuKey::Uuid("GPU-abc-1".into()));
        assert_eq!(m[1].gpu, GpuKey::PciBusId("0000:3b:00.0".into()));
        assert_eq!((m[2].index, m[2].at.line), (1, 5));
        assert!(m[0].gpu.matches("GPU-abc-1", "x"));
        assert!(m[1].gpu.matches("GPU-x", "00000000:3B:00.0"));
        assert!(!m[1].gpu.matches("GPU-x", "00000000:3C:00.0"));
    }

    #[test]
    fn bad_maps_name_the_line() {
        for (text, want) in [
            ("GPU-a: 1\nGPU-b: x\n", "map.yaml:2: index \"x\" of GPU-b is not a non-negative integer"),
            ("GPU-a: -1\n", "map.yaml:1: index \"-1\""),
            ("GPU-a: 1.5\n", "not a non-negative integer"),
            ("GPU-a: 1\nGPU-A: 2\n", "map.yaml:2: GPU-a is mapped twice (also at line 1)"),
            ("nvidia0: 1\n", "map.yaml:1: \"nvidia0\" is neither a GPU UUID"),
            ("GPU-a 1\n", "is not `GPU: index`"),
        ] {
            let e = p(text).unwrap_err();
            assert!(e.starts_with(want) || e.contains(want), "{text:?}: {e}");
        }
    }
}
