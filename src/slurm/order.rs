//! slurmd's GPU list emulated from slurm.conf and gres.conf (AutoDetect=off): a job's GPU index
//! (`scontrol show job -d` IDX, `SLURM_JOB_GPUS`) is the GPU's position in this list.
//!
//! The rule, observed with Debian's Slurm 22.05.8 and checked again by `tests/slurm.rs` against the
//! real slurmd: the types in the order slurm.conf's `Gres=` names them, then gres.conf's order
//! within a type (not a natural sort of File, not the number in the file name); with an untyped
//! `Gres=gpu:N`, gres.conf's order. Records beyond slurm.conf's count are dropped. Newer Slurm may
//! sort differently, which is why the real slurmd (`slurmd -G`) outranks this emulation.
//!
//! Shards (observed on 22.05.8): `Name=shard Count=N File=...` lines give each GPU they name `N`
//! split over their files; without File, slurm.conf's shard count is split evenly over the GPUs,
//! the remainder going one each to the last ones.

use super::conf::{ConfError, Location};
use super::gresconf::GresConf;
use super::slurmconf::NodeGres;
use std::path::PathBuf;

/// The rule this module applies, for logs and `migdra status`.
pub const RULE: &str =
    "slurm.conf Gres= type order, then gres.conf order within a type (as slurmd 22.05 and 26.05 order them)";

/// One entry of slurmd's GPU list; its position is its Slurm index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `/dev/nvidiaN`, or for a MIG instance the parent and its `nvidia-capN` files.
    pub files: Vec<PathBuf>,
    pub gres_type: Option<String>,
    /// Shards slurmd offers on this GPU; `None` when the node has no shard GRES.
    pub shards: Option<u32>,
    /// The gres.conf line it came from (emulation only), for error messages.
    pub at: Option<Location>,
}

/// The list and what slurmd would warn about on the way.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Emulation {
    pub records: Vec<Record>,
    pub notes: Vec<String>,
}

/// Emulate slurmd's list for a node.
///
/// # Errors
/// What slurmd refuses: typed and untyped GPUs mixed (in either file), a GPU line without File=,
/// no gpu GRES in slurm.conf.
pub fn emulate(node: &NodeGres, gres: &GresConf) -> Result<Emulation, ConfError> {
    let conf_err = |message: String| ConfError { at: node.at.clone(), message };
    let specs: Vec<_> = node.named("gpu").collect();
    if specs.is_empty() {
        return Err(conf_err("the node's Gres= has no gpu (e.g. Gres=gpu:a100:4)".into()));
    }
    let typed = specs.iter().filter(|s| s.gres_type.is_some()).count();
    if typed != 0 && typed != specs.len() {
        return Err(conf_err("some gpu GRES in Gres= have a type and others do not; slurmd refuses that".into()));
    }
    let lines: Vec<_> = gres.named("gpu").collect();
    if let (Some(a), Some(b)) =
        (lines.iter().find(|l| l.gres_type.is_some()), lines.iter().find(|l| l.gres_type.is_none()))
    {
        let later = if a.at.line > b.at.line { a } else { b };
        return Err(ConfError {
            at: later.at.clone(),
            message: "some Name=gpu lines have Type= and others do not; slurmd refuses that".into(),
        });
    }
    let mut all = Vec::new();
    for l in &lines {
        if l.files.is_empty() && l.multiple_files.is_empty() {
            return Err(ConfError {
                at: l.at.clone(),
                message: "Name=gpu without File= or MultipleFiles=: Slurm gives such GPUs no index".into(),
            });
        }
        let records: Vec<Vec<PathBuf>> = if l.multiple_files.is_empty() {
            l.files.iter().map(|f| vec![f.clone()]).collect()
        } else {
            vec![l.multiple_files.clone()]
        };
        all.extend(records.into_iter().map(|files| (l.gres_type.clone(), files, l.at.clone())));
    }
    let mut out = Emulation::default();
    let mut take = |want: Option<&str>, count: u64, out: &mut Emulation| {
        let mut taken = 0;
        all.retain(|(t, files, at)| {
            let matches = want.is_none_or(|w| t.as_deref().is_some_and(|t| t.eq_ignore_ascii_case(w)));
            if !matches {
                return true;
            }
            if taken < count {
                out.records.push(Record {
                    files: files.clone(),
                    gres_type: want.map(|_| t.clone()).unwrap_or_default(),
                    shards: None,
                    at: Some(at.clone()),
                });
                taken += 1;
            } else {
                out.notes.push(format!(
                    "gres.conf lists more {} GPUs than slurm.conf's Gres= ({count}); slurmd ignores {}",
                    want.unwrap_or("gpu"),
                    files[0].display()
                ));
            }
            false
        });
        if taken < count {
            out.notes.push(format!(
                "slurm.conf's Gres= counts {count} {} GPU(s) but gres.conf gives {taken}",
                want.unwrap_or("untyped")
            ));
        }
    };
    if typed == 0 {
        take(None, specs.iter().map(|s| s.count).sum(), &mut out);
    } else {
        let mut seen: Vec<&str> = Vec::new();
        for s in &specs {
            let t = s.gres_type.as_deref().unwrap_or_default();
            if seen.iter().any(|x| x.eq_ignore_ascii_case(t)) {
                continue;
            }
            seen.push(t);
            let count = specs
                .iter()
                .filter(|x| x.gres_type.as_deref().is_some_and(|y| y.eq_ignore_ascii_case(t)))
                .map(|x| x.count)
                .sum();
            take(Some(t), count, &mut out);
        }
        for (t, files, _) in &all {
            out.notes.push(format!(
                "gres.conf type {:?} ({}) is not in slurm.conf's Gres=; slurmd ignores it",
                t.as_deref().unwrap_or(""),
                files[0].display()
            ));
        }
    }
    assign_shards(node, gres, &mut out);
    Ok(out)
}

fn assign_shards(node: &NodeGres, gres: &GresConf, out: &mut Emulation) {
    let total: u64 = node.named("shard").map(|s| s.count).sum();
    let lines: Vec<_> = gres.named("shard").collect();
    if total == 0 {
        if !lines.is_empty() {
            out.notes
                .push("gres.conf has Name=shard lines but slurm.conf's Gres= has no shard; slurmd ignores them".into());
        }
        return;
    }
    let n = out.records.len() as u64;
    if lines.iter().any(|l| !l.files.is_empty()) {
        for r in &mut out.records {
            r.shards = Some(0);
        }
        for l in lines.iter().filter(|l| !l.files.is_empty()) {
            let files = l.files.len() as u64;
            let each = l.count.unwrap_or(0) / files;
            for f in &l.files {
                match out.records.iter_mut().find(|r| r.files.first() == Some(f)) {
                    Some(r) => r.shards = Some(r.shards.unwrap_or(0) + each as u32),
                    None => out.notes.push(format!(
                        "{}: shard File={} matches no gpu record; slurmd discards it",
                        l.at,
                        f.display()
                    )),
                }
            }
        }
    } else if let (Some(base), Some(extra)) = (total.checked_div(n), total.checked_rem(n)) {
        for (i, r) in out.records.iter_mut().enumerate() {
            r.shards = Some((base + u64::from(i as u64 >= n - extra)) as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{conf, gresconf, slurmconf};
    use super::*;

    fn run(slurm: &str, gres: &str) -> Result<Emulation, String> {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("slurm.conf"), format!("NodeName=vm CPUs=4 Gres={slurm}\n")).unwrap();
        std::fs::write(d.path().join("gres.conf"), gres).unwrap();
        let node = slurmconf::node_gres(&conf::read(&d.path().join("slurm.conf")).unwrap(), "vm").unwrap();
        let g = gresconf::parse(&conf::read(&d.path().join("gres.conf")).unwrap(), "vm").map_err(|e| e.message)?;
        emulate(&node, &g).map_err(|e| e.message)
    }

    fn files(e: &Emulation) -> Vec<String> {
        e.records
            .iter()
            .map(|r| r.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join("+"))
            .collect()
    }

    fn shards(e: &Emulation) -> Vec<Option<u32>> {
        e.records.iter().map(|r| r.shards).collect()
    }

    /// Each case was printed by Debian's slurmd 22.05.8 (`slurmd -G`) for the same files.
    #[test]
    fn orders_like_slurmd_22_05() {
        let e = run(
            "gpu:b:3,gpu:a:3",
            "Name=gpu Type=a File=/d/nvidia[10-12]\nName=gpu Type=b File=/d/nvidia[3-4]\n\
             Name=gpu Type=b File=/d/nvidia1\n",
        )
        .unwrap();
        assert_eq!(files(&e), ["/d/nvidia3", "/d/nvidia4", "/d/nvidia1", "/d/nvidia10", "/d/nvidia11", "/d/nvidia12"]);
        let e = run(
            "gpu:6",
            "Name=gpu Type=a File=/d/nvidia[10-12]\nName=gpu Type=b File=/d/nvidia[3-4]\n\
             Name=gpu Type=b File=/d/nvidia1\n",
        )
        .unwrap();
        assert_eq!(files(&e), ["/d/nvidia10", "/d/nvidia11", "/d/nvidia12", "/d/nvidia3", "/d/nvidia4", "/d/nvidia1"]);
        assert_eq!(e.records[0].gres_type, None);
        let e = run("gpu:a:2,gpu:b:2", "Name=gpu Type=b File=/d/nvidia[10-12]\nName=gpu Type=a File=/d/nvidia[3-4]\n")
            .unwrap();
        assert_eq!(files(&e), ["/d/nvidia3", "/d/nvidia4", "/d/nvidia10", "/d/nvidia11"]);
        assert!(e.notes[0].contains("slurmd ignores /d/nvidia12"), "{:?}", e.notes);
        let e = run("gpu:4", "Name=gpu File=/d/nvidia[10-12],/d/nvidia3\n").unwrap();
        assert_eq!(files(&e), ["/d/nvidia10", "/d/nvidia11", "/d/nvidia12", "/d/nvidia3"]);
    }

    #[test]
    fn refuses_what_slurmd_refuses() {
        let e = run("gpu:a:3,gpu:3", "Name=gpu Type=a File=/d/nvidia[0-2]\n").unwrap_err();
        assert!(e.contains("some gpu GRES in Gres= have a type"), "{e}");
        let e = run("gpu:4", "Name=gpu File=/d/nvidia[10-12]\nName=gpu Type=x File=/d/nvidia3\n").unwrap_err();
        assert!(e.contains("some Name=gpu lines have Type="), "{e}");
        let e = run("shard:4", "Name=gpu File=/d/nvidia0\n").unwrap_err();
        assert!(e.contains("has no gpu"), "{e}");
        let e = run("gpu:1", "Name=gpu Count=1\n").unwrap_err();
        assert!(e.contains("without File="), "{e}");
    }

    #[test]
    fn shards_like_slurmd_22_05() {
        let gpus = "Name=gpu Type=y File=/d/nvidia[10-12]\nName=gpu Type=x File=/d/nvidia3\n";
        assert_eq!(shards(&run("gpu:x:1,gpu:y:3,shard:8", gpus).unwrap()), [Some(2); 4]);
        let e = run("gpu:x:1,gpu:y:3,shard:8", &format!("{gpus}Name=shard Count=8\n")).unwrap();
        assert_eq!(shards(&e), [Some(2); 4]);
        let e = run("gpu:x:1,gpu:y:3,shard:10", &format!("{gpus}Name=shard Count=10\n")).unwrap();
        assert_eq!(shards(&e), [Some(2), Some(2), Some(3), Some(3)]);
        let e = run(
            "gpu:x:1,gpu:y:3,shard:10",
            &format!("{gpus}Name=shard Count=7 File=/d/nvidia3\nName=shard Count=3 File=/d/nvidia[10-12]\n"),
        )
        .unwrap();
        assert_eq!(shards(&e), [Some(7), Some(1), Some(1), Some(1)]);
        let e = run("gpu:x:1,gpu:y:3", &format!("{gpus}Name=shard Count=8\n")).unwrap();
        assert_eq!(shards(&e), [None; 4]);
        assert!(e.notes[0].contains("no shard"));
        let e = run("gpu:x:1,gpu:y:3,shard:4", &format!("{gpus}Name=shard Count=4 File=/d/nvidia3\n")).unwrap();
        assert_eq!(shards(&e), [Some(4), Some(0), Some(0), Some(0)]);
    }
}
