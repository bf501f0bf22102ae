//! The procfs tree the NVIDIA driver keeps, kept the same way from the simulator's state: the
//! `nvidia-caps` line of `devices`, an `access` file per GPU and compute instance under
//! `driver/nvidia/capabilities` (created and removed with the instances), and the boot ID.
//! Files are replaced atomically, so a reader never sees one half-written or missing.

use migdra::gpu::capability_minors;
use migdra::gpu::sim::SimState;
use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::Path;

/// The `nvidia-caps` major this fake's driver got: the value the MIG guide's text gives (the
/// simulator itself reports 508, so a test can tell which one a backend read).
pub const CAPS_MAJOR: u32 = 238;

/// What decides the tree's content; unchanged means nothing to write.
pub fn fingerprint(st: &SimState) -> String {
    let mut s = st.boot_id.clone();
    for g in st.gpus.iter().filter(|g| g.mig_enabled) {
        s.push_str(&format!(";{}", g.minor));
        for gi in &g.gpu_instances {
            let cis: Vec<String> = gi.compute_instances.iter().map(|c| c.id.to_string()).collect();
            s.push_str(&format!(":{}/{}", gi.id, cis.join(".")));
        }
    }
    s
}

/// Bring the tree under `root` up to date with `st`.
pub fn write(root: &Path, st: &SimState) -> io::Result<()> {
    replace(&root.join("devices"), &devices_text())?;
    replace(&root.join("sys/kernel/random/boot_id"), &format!("{}\n", st.boot_id))?;
    let caps = root.join("driver/nvidia/capabilities");
    // Global MIG capabilities: config (create/destroy rights, mode 0400) and monitor (docs/facts/mig-nvml.md §4).
    replace(&caps.join("mig/config"), "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")?;
    replace(&caps.join("mig/monitor"), "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")?;
    for g in st.gpus.iter().filter(|g| g.mig_enabled) {
        let mig = caps.join(format!("gpu{}/mig", g.minor));
        fs::create_dir_all(&mig)?;
        let mut keep = BTreeSet::new();
        for gi in &g.gpu_instances {
            let name = format!("gi{}", gi.id);
            let dir = mig.join(&name);
            replace(&dir.join("access"), &access(capability_minors(g.minor, gi.id, 0).0))?;
            let mut keep_ci = BTreeSet::from(["access".to_string()]);
            for ci in &gi.compute_instances {
                replace(&dir.join(format!("ci{}/access", ci.id)), &access(capability_minors(g.minor, gi.id, ci.id).1))?;
                keep_ci.insert(format!("ci{}", ci.id));
            }
            prune(&dir, &keep_ci)?;
            keep.insert(name);
        }
        prune(&mig, &keep)?;
    }
    Ok(())
}

fn devices_text() -> String {
    format!(
        "Character devices:\n  1 mem\n  4 /dev/vc/0\n  4 tty\n195 nvidia-frontend\n{CAPS_MAJOR} nvidia-caps\n\
         509 nvidia-uvm\n\nBlock devices:\n  7 loop\n  8 sd\n"
    )
}

fn access(minor: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
}

/// Remove every entry of `dir` not named in `keep` (instances that no longer exist).
fn prune(dir: &Path, keep: &BTreeSet<String>) -> io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if keep.contains(&name) || name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() { fs::remove_dir_all(path)? } else { fs::remove_file(path)? }
    }
    Ok(())
}

/// Write `text` to `path` atomically, unless it already holds exactly that.
fn replace(path: &Path, text: &str) -> io::Result<()> {
    if fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    fs::write(&tmp, text)?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use migdra::gpu::GpuBackend;
    use migdra::gpu::procfs::Procfs;
    use migdra::gpu::sim::{SimBackend, SimSpec};

    #[test]
    fn the_tree_follows_the_instances_and_migdra_reads_it() {
        let sim = SimBackend::in_memory_seeded(&SimSpec::parse("h100-80gb:2").unwrap(), 7);
        let dir = tempfile_dir();
        let gi = sim.create_gpu_instance("0", 9, 4).unwrap();
        let ci = sim.create_compute_instance("0", gi.id, 2).unwrap();
        let st = sim.state().unwrap();
        write(&dir, &st).unwrap();
        let p = Procfs::new(&dir);
        let minor = st.gpus[0].minor;
        assert_eq!(p.caps_major().unwrap(), CAPS_MAJOR);
        assert_eq!(p.boot_id().unwrap(), st.boot_id);
        assert_eq!(p.mig_capability_minors(minor, gi.id, ci.id).unwrap(), capability_minors(minor, gi.id, ci.id));
        sim.destroy_compute_instance("0", gi.id, ci.id).unwrap();
        let st2 = sim.state().unwrap();
        assert_ne!(fingerprint(&st), fingerprint(&st2));
        write(&dir, &st2).unwrap();
        assert!(p.mig_capability_minors(minor, gi.id, ci.id).is_err(), "the CI's file is gone");
        sim.destroy_gpu_instance("0", gi.id).unwrap();
        write(&dir, &sim.state().unwrap()).unwrap();
        assert!(!p.gi_dir(minor, gi.id).exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("fake-nvml-procfs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }
}
