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
    let mut cmd = Command::new(slurmd);
    cmd.arg("-G").arg("-f").arg(slurm_conf).arg("-N").arg(node);
    let what = format!("{} -G -f {} -N {node}", slurmd.display(), slurm_conf.display());
    let text = run(&mut cmd, slurmd, &what)?;
    let records = parse(&text);
    if records.is_empty() {
        return Err(format!("{} -G lists no gpu GRES for node {node}", slurmd.display()));
    }
    Ok(records)
}

/// Run `cmd` (slurmd, shown in errors as `what`) for at most [`TIMEOUT`]: stdout and stderr
/// together.
///
/// # Errors
/// It cannot be started, times out, or fails (its last line is quoted).
fn run(cmd: &mut Command, slurmd: &Path, what: &str) -> Result<String, String> {
    let mut child = cmd
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
                return Err(format!("{what} did not finish in {}s", TIMEOUT.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(format!("waiting for {}: {e}", slurmd.display())),
        }
    };
    let output = child.wait_with_output().map_err(|e| format!("reading {what}: {e}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if !status.success() {
        let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
        return Err(format!("{what} failed ({status}): {last}"));
    }
    Ok(text)
}

/// A Slurm release, as `slurmd -V` prints it (`slurm-wlm 26.05.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release {
    pub major: u32,
    pub minor: u32,
    pub micro: u32,
}

impl Release {
    /// The oldest and newest releases whose GPU order was checked against migdra's: Debian 12's
    /// 22.05 and 26.05, the release slurm-bridge users run. Both number GPUs alike.
    pub const CHECKED: (Self, Self) =
        (Self { major: 22, minor: 5, micro: 0 }, Self { major: 26, minor: 5, micro: u32::MAX });

    /// The last word of `slurmd -V`'s output, `major.minor.micro` (a suffix after the micro
    /// number is ignored).
    pub fn parse(text: &str) -> Option<Self> {
        let word = text.split_whitespace().last()?;
        let mut parts = word.splitn(3, '.');
        let number = |p: Option<&str>| -> Option<u32> {
            let p = p?;
            let digits = p.find(|c: char| !c.is_ascii_digit()).map_or(p, |end| &p[..end]);
            digits.parse().ok()
        };
        Some(Self { major: number(parts.next())?, minor: number(parts.next())?, micro: number(parts.next())? })
    }

    pub fn is_known(self) -> bool {
        (Self::CHECKED.0..=Self::CHECKED.1).contains(&self)
    }
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:02}.{}", self.major, self.minor, self.micro)
    }
}

/// `slurmd -V`: the release of the Slurm on this node.
///
/// # Errors
/// slurmd cannot be run, fails or prints no version.
pub fn version(slurmd: &Path) -> Result<Release, String> {
    let out = run(Command::new(slurmd).arg("-V"), slurmd, &format!("{} -V", slurmd.display()))?;
    Release::parse(&out).ok_or_else(|| format!("{} -V printed no version: {}", slurmd.display(), out.trim()))
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
slurmd: Gres Name=gpu Type=(null) Count=1 Index=2 ID=7696487 \
    File=/tmp/sx/dev/nvidia2,/dev/nvidia-caps/nvidia-cap21,/dev/nvidia-caps/nvidia-cap22 (null)
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

    /// Printed by Debian unstable's slurmd 26.05.5 (stderr, time-stamped): the same records,
    /// with Links= and Flags= after the file, each gpu record after its file's shard record.
    const OUTPUT_2605: &str = "\
[2026-12-03T13:35:52.039] Node configuration differs from hardware: CPUs=32:2(hw) Boards=1:1(hw)
[2026-12-03T13:35:52.039] Gres Name=shard Type=m3 Count=4 Index=3 ID=1918986455 \
    File=/tmp/s26/dev/nvidia3 Cores=0-3 CoreCnt=32 Links=(null) Flags=HAS_FILE,HAS_TYPE,SHARED
[2026-12-03T13:35:52.039] Gres Name=gpu Type=m3 Count=1 Index=3 ID=7696487 \
    File=/tmp/s26/dev/nvidia3 Cores=0-3 CoreCnt=32 Links=(null) \
    Flags=HAS_FILE,HAS_TYPE,ENV_NVML,ENV_RSMI,ENV_ONEAPI,ENV_OPENCL,ENV_DEFAULT
[2026-12-03T13:35:52.039] Gres Name=shard Type=m0 Count=8 Index=0 ID=1918986455 \
    File=/tmp/s26/dev/nvidia0 Links=(null) Flags=HAS_FILE,HAS_TYPE,SHARED
[2026-12-03T13:35:52.039] Gres Name=gpu Type=m0 Count=1 Index=0 ID=7696487 \
    File=/tmp/s26/dev/nvidia0 Links=(null) \
    Flags=HAS_FILE,HAS_TYPE,ENV_NVML,ENV_RSMI,ENV_ONEAPI,ENV_OPENCL,ENV_DEFAULT
[2026-12-03T13:35:52.039] Gres Name=shard Type=m2 Count=0 Index=2 ID=1918986455 \
    File=/tmp/s26/dev/nvidia2 Links=(null) \
    Flags=HAS_FILE,HAS_TYPE,ENV_NVML,ENV_RSMI,ENV_ONEAPI,ENV_OPENCL,ENV_DEFAULT,SHARED
[2026-12-03T13:35:52.039] Gres Name=gpu Type=m2 Count=1 Index=2 ID=7696487 \
    File=/tmp/s26/dev/nvidia2 Links=(null) \
    Flags=HAS_FILE,HAS_TYPE,ENV_NVML,ENV_RSMI,ENV_ONEAPI,ENV_OPENCL,ENV_DEFAULT
";

    #[test]
    fn reads_26_05_records_too() {
        let r = parse(OUTPUT_2605);
        let files: Vec<&str> = r.iter().map(|r| r.files[0].to_str().unwrap()).collect();
        assert_eq!(files, ["/tmp/s26/dev/nvidia3", "/tmp/s26/dev/nvidia0", "/tmp/s26/dev/nvidia2"]);
        let types: Vec<Option<&str>> = r.iter().map(|r| r.gres_type.as_deref()).collect();
        assert_eq!(types, [Some("m3"), Some("m0"), Some("m2")]);
        let shards: Vec<Option<u32>> = r.iter().map(|r| r.shards).collect();
        assert_eq!(shards, [Some(4), Some(8), Some(0)]);
    }

    #[test]
    fn versions_of_both_releases_and_unknown_ones() {
        assert_eq!(Release::parse("slurm-wlm 22.05.8\n"), Some(Release { major: 22, minor: 5, micro: 8 }));
        assert_eq!(Release::parse("slurm 26.05.5\n"), Some(Release { major: 26, minor: 5, micro: 5 }));
        assert_eq!(Release::parse("slurm 26.05.0-0rc1"), Some(Release { major: 26, minor: 5, micro: 0 }));
        assert_eq!(Release::parse("slurmd: fatal: x"), None);
        assert_eq!(Release { major: 26, minor: 5, micro: 5 }.to_string(), "26.05.5");
        assert!(Release { major: 22, minor: 5, micro: 8 }.is_known());
        assert!(Release { major: 25, minor: 11, micro: 3 }.is_known());
        assert!(!Release { major: 21, minor: 8, micro: 8 }.is_known());
        assert!(!Release { major: 26, minor: 11, micro: 0 }.is_known());
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
