//! slurmd's own GPU list: `slurmd -G` prints every GRES record it configured, in the order that
//! gives each its index, as lines like
//! `slurmd: Gres Name=gpu Type=a100 Count=1 Index=10 ID=7696487 File=/dev/nvidia10 (null)`.
//! `Index=` there is the number in the file name, not the Slurm index: the position is.

use super::order::Record;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long `slurmd -G` may take; it only reads files, so anything longer is a hang.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Run `slurmd -G` for `node` and read its list.
///
/// # Errors
/// slurmd cannot be started, fails (its last line is quoted), times out, or lists no GPU.
pub fn query(slurmd: &Path, slurm_conf: &Path, node: &str) -> Result<Vec<Record>, String> {
    let mut child = Command::new(slurmd)
        .arg("-G")
        .arg("-f")
        .arg(slurm_conf)
        .arg("-N")
        .arg(node)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", slurmd.display()))?;
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() > TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{} -G did not finish in {}s", slurmd.display(), TIMEOUT.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for {}: {e}", slurmd.display())),
        }
    };
    let output = child.wait_with_output().map_err(|e| format!("reading {} -G: {e}", slurmd.display()))?;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if !status.success() {
        let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
        return Err(format!("{} -G -f {} -N {node} failed ({status}): {last}", slurmd.display(), slurm_conf.display()));
    }
    let records = parse(&text);
    if records.is_empty() {
        return Err(format!("{} -G lists no gpu GRES for node {node}", slurmd.display()));
    }
    Ok(records)
}

/// The gpu records in order, each with the shard count of the shard record on the same file.
pub fn parse(text: &str) -> Vec<Record> {
    let lines: Vec<Fields> = text.lines().filter_map(Fields::parse).collect();
    let shard_lines: Vec<&Fields> = lines.iter().filter(|f| f.name == "shard").collect();
    let any_shards = !shard_lines.is_empty();
    lines
        .iter()
        .filter(|f| f.name == "gpu")
        .map(|g| Record {
            files: g.files.clone(),
            gres_type: g.gres_type.clone(),
            shards: any_shards.then(|| shard_lines.iter().filter(|s| s.files == g.files).map(|s| s.count).sum()),
            at: None,
        })
        .collect()
}

struct Fields {
    name: String,
    gres_type: Option<String>,
    count: u32,
    files: Vec<PathBuf>,
}

impl Fields {
    fn parse(line: &str) -> Option<Self> {
        let rest = &line[line.find("Gres Name=")? + "Gres ".len()..];
        let value = |key: &str| -> Option<&str> {
            let at = rest.find(&format!("{key}="))? + key.len() + 1;
            let v = &rest[at..];
            Some(v.split_whitespace().next().unwrap_or(""))
        };
        let name = value("Name")?.to_ascii_lowercase();
        let gres_type = value("Type").filter(|t| *t != "(null)" && !t.is_empty()).map(str::to_string);
        let count = value("Count").and_then(|c| c.parse().ok()).unwrap_or(0);
        let files = value("File")
            .filter(|f| *f != "(null)")
            .map_or_else(Vec::new, |f| f.split(',').filter(|p| !p.is_empty()).map(PathBuf::from).collect());
        Some(Self { name, gres_type, count, files })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Printed by Debian's slurmd 22.05.8.
    const OUTPUT: &str = "\
slurmd: Gres Name=shard Type=m10 Count=4 Index=10 ID=1918986455 File=/tmp/sx/dev/nvidia10 (null)
slurmd: Gres Name=gpu Type=m10 Count=1 Index=10 ID=7696487 File=/tmp/sx/dev/nvidia10 (null)
slurmd: Gres Name=shard Type=m13 Count=4 Index=13 ID=1918986455 File=/tmp/sx/dev/nvidia13 Cores=0-3 CoreCnt=16 (null)
slurmd: Gres Name=gpu Type=m13 Count=1 Index=13 ID=7696487 File=/tmp/sx/dev/nvidia13 Cores=0-3 CoreCnt=16 (null)
slurmd: Gres Name=gpu Type=(null) Count=1 Index=2 ID=7696487 File=/tmp/sx/dev/nvidia2,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22 (null)
";

    #[test]
    fn reads_gpu_records_in_order_with_their_shards() {
        let r = parse(OUTPUT);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].files, [PathBuf::from("/tmp/sx/dev/nvidia10")]);
        assert_eq!(r[0].gres_type.as_deref(), Some("m10"));
        assert_eq!(r[0].shards, Some(4));
        assert_eq!(r[1].shards, Some(4));
        assert_eq!(r[2].gres_type, None);
        assert_eq!(r[2].files.len(), 3);
        assert_eq!(r[2].shards, Some(0));
        assert!(parse("slurmd: fatal: something\n").is_empty());
    }

    #[test]
    fn failures_are_one_line_with_slurmds_reason() {
        let d = tempfile::tempdir().unwrap();
        let fake = d.path().join("slurmd");
        std::fs::write(&fake, "#!/bin/sh\necho 'slurmd: fatal: Invalid GRES record for gpu' >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let e = query(&fake, Path::new("/etc/slurm/slurm.conf"), "vm").unwrap_err();
        assert!(e.ends_with("slurmd: fatal: Invalid GRES record for gpu"), "{e}");
        let e = query(&d.path().join("missing"), Path::new("/x"), "vm").unwrap_err();
        assert!(e.starts_with("cannot run"), "{e}");
    }
}
