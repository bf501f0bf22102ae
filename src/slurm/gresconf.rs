//! gres.conf: the lines that apply to one node, checked the way slurmd checks them (unknown keys,
//! ranges that don't expand, `File` with `MultipleFiles`, a `Count` that disagrees with `File`).

use super::conf::{ConfError, Line, Location};
use super::hostlist;
use std::path::PathBuf;

/// Keys gres.conf knows (gres.conf(5)); slurmd refuses anything else.
const KEYS: [&str; 10] =
    ["AutoDetect", "Count", "Cores", "File", "Flags", "Links", "MultipleFiles", "Name", "NodeName", "Type"];

/// `AutoDetect=` values slurmd accepts.
const AUTODETECT: [&str; 6] = ["off", "nvml", "nvidia", "rsmi", "oneapi", "nrt"];

/// The gres.conf lines of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GresConf {
    /// The last `AutoDetect=` that applies to the node (`off` when unset).
    pub autodetect: Option<String>,
    pub lines: Vec<GresLine>,
}

/// One `Name=` line that applies to the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GresLine {
    pub at: Location,
    /// `gpu`, `shard`, ... (lower case).
    pub name: String,
    pub gres_type: Option<String>,
    /// `File=` expanded: one GRES record per file.
    pub files: Vec<PathBuf>,
    /// `MultipleFiles=`: one record holding all of them (a MIG instance: parent + capability files).
    pub multiple_files: Vec<PathBuf>,
    pub count: Option<u64>,
}

impl GresConf {
    /// Whether slurmd asks a library (NVML) for the GPUs instead of reading File= lines.
    pub fn autodetects(&self) -> bool {
        self.autodetect.as_deref().is_some_and(|a| a != "off")
    }

    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a GresLine> + 'a {
        self.lines.iter().filter(move |l| l.name == name)
    }
}

/// Select and check the lines of `node`.
///
/// # Errors
/// The first line slurmd would refuse, with its file and line.
pub fn parse(lines: &[Line], node: &str) -> Result<GresConf, ConfError> {
    let mut out = GresConf::default();
    for line in lines {
        if let Some((k, _)) = line.pairs.iter().find(|(k, _)| !KEYS.iter().any(|known| known.eq_ignore_ascii_case(k))) {
            return Err(line.error(format!("unknown key {k:?}; gres.conf keys are {}", KEYS.join(", "))));
        }
        if let Some(sel) = line.get("NodeName") {
            let mine = hostlist::contains(sel, node).map_err(|e| line.error(format!("NodeName={sel}: {e}")))?;
            if !mine {
                continue;
            }
        }
        if let Some(a) = line.get("AutoDetect") {
            let a = a.to_ascii_lowercase();
            if !AUTODETECT.contains(&a.as_str()) {
                return Err(line.error(format!("AutoDetect={a} is not one of {}", AUTODETECT.join(", "))));
            }
            out.autodetect = Some(a);
        }
        let Some(name) = line.get("Name") else {
            if line
                .pairs
                .iter()
                .all(|(k, _)| k.eq_ignore_ascii_case("AutoDetect") || k.eq_ignore_ascii_case("NodeName"))
            {
                continue;
            }
            return Err(line.error("a GRES line needs Name= (e.g. Name=gpu)"));
        };
        out.lines.push(gres_line(line, name)?);
    }
    Ok(out)
}

fn gres_line(line: &Line, name: &str) -> Result<GresLine, ConfError> {
    let expand = |key: &str| -> Result<Vec<PathBuf>, ConfError> {
        line.get(key).map_or(Ok(Vec::new()), |v| {
            hostlist::expand(v)
                .map(|names| names.into_iter().map(PathBuf::from).collect())
                .map_err(|e| line.error(format!("{key}={v}: {e}")))
        })
    };
    let files = expand("File")?;
    let multiple_files = expand("MultipleFiles")?;
    if !files.is_empty() && !multiple_files.is_empty() {
        return Err(line.error("File= and MultipleFiles= exclude each other"));
    }
    let count = line.get("Count").map(|c| count(c).map_err(|e| line.error(e))).transpose()?;
    let name = name.to_ascii_lowercase();
    if name == "gpu"
        && let Some(c) = count
        && !files.is_empty()
        && c != files.len() as u64
    {
        return Err(line.error(format!("Count={c} does not match the {} file(s) of File=", files.len())));
    }
    Ok(GresLine {
        at: line.at.clone(),
        name,
        gres_type: line.get("Type").filter(|t| !t.is_empty()).map(str::to_string),
        files,
        multiple_files,
        count,
    })
}

/// `4`, `2K` (×1024), `1M`, `1G`, like slurmd.
pub fn count(s: &str) -> Result<u64, String> {
    let bad = || format!("Count={s} is not a whole number (optionally with K, M or G)");
    let (digits, mult) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    digits.parse::<u64>().ok().and_then(|n| n.checked_mul(mult)).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::super::conf;
    use super::*;
    use std::path::Path;

    fn parse_text(text: &str, node: &str) -> Result<GresConf, ConfError> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("gres.conf");
        std::fs::write(&p, text).unwrap();
        let lines = conf::read(&p)
            .map_err(|e| ConfError { at: Location { file: "gres.conf".into(), line: e.at.line }, ..e })?;
        parse(&lines, node).map_err(|e| ConfError { at: Location { file: "gres.conf".into(), line: e.at.line }, ..e })
    }

    #[test]
    fn selects_node_lines_and_expands_files() {
        let g = parse_text(
            "AutoDetect=off\nNodeName=other[1-3] Name=gpu File=/dev/nvidia9\n\
             NodeName=vm,gpu[1-2] Name=gpu Type=a100 File=/dev/nvidia[0-1] Cores=0-3\nName=shard Count=8\n",
            "vm",
        )
        .unwrap();
        assert_eq!(g.autodetect.as_deref(), Some("off"));
        assert!(!g.autodetects());
        assert_eq!(g.lines.len(), 2);
        assert_eq!(g.lines[0].files, [Path::new("/dev/nvidia0"), Path::new("/dev/nvidia1")]);
        assert_eq!(g.lines[0].gres_type.as_deref(), Some("a100"));
        assert_eq!(g.lines[1].name, "shard");
        assert_eq!(g.lines[1].count, Some(8));
        let g = parse_text("NodeName=vm AutoDetect=nvml\n", "vm").unwrap();
        assert!(g.autodetects());
    }

    #[test]
    fn refuses_what_slurmd_refuses() {
        for (text, want) in [
            ("Name=gpu File=/dev/nvidia0 Bogus=1\n", "gres.conf:1: unknown key \"Bogus\""),
            (
                "\nName=gpu File=/dev/nvidia[0-3\n",
                "gres.conf:2: File=/dev/nvidia[0-3: \"/dev/nvidia[0-3\": '[' without ']'",
            ),
            ("Name=gpu File=/dev/nvidia[3-0]\n", "gres.conf:1: File=/dev/nvidia[3-0]"),
            ("Name=gpu File=/dev/nvidia[0-1] Count=3\n", "gres.conf:1: Count=3 does not match the 2 file(s)"),
            ("Name=gpu Count=x\n", "gres.conf:1: Count=x is not a whole number"),
            ("Type=a100 File=/dev/nvidia0\n", "gres.conf:1: a GRES line needs Name="),
            ("AutoDetect=cuda\n", "gres.conf:1: AutoDetect=cuda is not one of"),
            ("Name=gpu File=/a MultipleFiles=/b,/c\n", "exclude each other"),
            ("NodeName=vm[1- Name=gpu File=/a\n", "gres.conf:1: NodeName=vm[1-"),
            ("Name=gpu File\n", "gres.conf:1: \"File\" is not Key=Value"),
        ] {
            let e = parse_text(text, "vm").unwrap_err().to_string();
            assert!(e.starts_with(want) || e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn counts() {
        assert_eq!(count("4"), Ok(4));
        assert_eq!(count("2K"), Ok(2048));
        assert_eq!(count("1g"), Ok(1 << 30));
        assert!(count("-1").is_err());
        assert!(count("").is_err());
        assert!(count("99999999999999999999").is_err());
    }
}
