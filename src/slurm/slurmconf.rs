//! slurm.conf: only what decides GPU order and shards, the `Gres=` of this node's `NodeName=` line
//! (or of the `NodeName=DEFAULT` line before it).

use super::conf::{ConfError, Line, Location};
use super::gresconf::count;
use super::hostlist;

/// One item of `Gres=gpu:a100:4,shard:16`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GresSpec {
    pub name: String,
    pub gres_type: Option<String>,
    pub count: u64,
}

/// The node's `Gres=` and where it was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGres {
    pub at: Location,
    pub specs: Vec<GresSpec>,
}

impl NodeGres {
    pub fn named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a GresSpec> + 'a {
        self.specs.iter().filter(move |s| s.name == name)
    }
}

/// The `Gres=` of `node`.
///
/// # Errors
/// No `NodeName=` line names the node, a `NodeName=` expression or `Gres=` item is malformed.
pub fn node_gres(lines: &[Line], node: &str) -> Result<NodeGres, ConfError> {
    let mut default: Option<(&Line, &str)> = None;
    for line in lines {
        let Some(sel) = line.get("NodeName") else { continue };
        if sel.eq_ignore_ascii_case("DEFAULT") {
            if let Some(g) = line.get("Gres") {
                default = Some((line, g));
            }
            continue;
        }
        if !hostlist::contains(sel, node).map_err(|e| line.error(format!("NodeName={sel}: {e}")))? {
            continue;
        }
        let (from, gres) = match line.get("Gres") {
            Some(g) => (line, g),
            None => default.unwrap_or((line, "")),
        };
        return Ok(NodeGres { at: from.at.clone(), specs: parse_gres(gres).map_err(|e| from.error(e))? });
    }
    let file = lines.first().map_or_else(|| "slurm.conf".into(), |l| l.at.file.display().to_string());
    Err(ConfError {
        at: Location { file: file.into(), line: 0 },
        message: format!("no NodeName= line names node {node:?} (set --slurm-node-name to the node's Slurm name)"),
    })
}

/// `gpu:a100:4,gpu:2,shard:16,gpu:tesla:no_consume:1,gpu:a100:2(S:0-1)`.
pub fn parse_gres(s: &str) -> Result<Vec<GresSpec>, String> {
    let mut out = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let item = item.split_once('(').map_or(item, |(head, _)| head);
        let mut parts: Vec<&str> = item.split(':').filter(|p| !p.eq_ignore_ascii_case("no_consume")).collect();
        let name = parts.remove(0).to_ascii_lowercase();
        if name.is_empty() {
            return Err(format!("Gres item {item:?} has no name"));
        }
        // A last part that reads as a count is one; `gpu:3g.40gb` is a type.
        let count = match parts.last().map(|l| count(l)) {
            Some(Ok(n)) => {
                parts.pop();
                n
            }
            _ => 1,
        };
        if parts.len() > 1 {
            return Err(format!("Gres item {item:?} is not name[:type][:count]"));
        }
        out.push(GresSpec { name, gres_type: parts.first().map(|t| t.to_string()), count });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<Line> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("slurm.conf");
        std::fs::write(&p, text).unwrap();
        super::super::conf::read(&p).unwrap()
    }

    fn spec(name: &str, t: Option<&str>, count: u64) -> GresSpec {
        GresSpec { name: name.into(), gres_type: t.map(Into::into), count }
    }

    #[test]
    fn finds_the_node_line_and_its_gres() {
        let l = lines(
            "ClusterName=x\nNodeName=DEFAULT Gres=gpu:8\nNodeName=a[1-4] CPUs=4\n\
             NodeName=vm CPUs=16 Gres=gpu:m10:1,gpu:m0:1,shard:16(S:0-1)\n",
        );
        let g = node_gres(&l, "vm").unwrap();
        assert_eq!(g.at.line, 4);
        assert_eq!(g.specs, [spec("gpu", Some("m10"), 1), spec("gpu", Some("m0"), 1), spec("shard", None, 16)]);
        let a = node_gres(&l, "a3").unwrap();
        assert_eq!((a.at.line, a.specs.clone()), (2, vec![spec("gpu", None, 8)]));
        let e = node_gres(&l, "zz").unwrap_err().to_string();
        assert!(e.contains("no NodeName= line names node \"zz\""), "{e}");
    }

    #[test]
    fn gres_items() {
        assert_eq!(
            parse_gres("gpu:tesla:no_consume:2,mps:100").unwrap(),
            [spec("gpu", Some("tesla"), 2), spec("mps", None, 100)]
        );
        assert_eq!(parse_gres("gpu").unwrap(), [spec("gpu", None, 1)]);
        assert_eq!(parse_gres("gpu:a100").unwrap(), [spec("gpu", Some("a100"), 1)]);
        assert!(parse_gres("gpu:a:b:3").unwrap_err().contains("name[:type][:count]"));
        assert!(parse_gres("gpu:a:3x").unwrap_err().contains("name[:type][:count]"));
        assert_eq!(parse_gres("gpu:3g.40gb").unwrap(), [spec("gpu", Some("3g.40gb"), 1)]);
    }
}
