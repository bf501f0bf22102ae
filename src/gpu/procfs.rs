//! What the NVIDIA driver publishes in procfs and NVML does not: the `nvidia-caps` major, the
//! capability minors of each MIG instance (docs/facts/mig-nvml.md §4), and the kernel's boot ID.
//!
//! The root is configurable (`--procfs-root`), so tests point it at a tree the fake
//! libnvidia-ml writes the way the driver does.

use super::{GpuError, Result};
use std::path::{Path, PathBuf};

/// The host's procfs.
pub const HOST_ROOT: &str = "/proc";

/// A procfs tree: `/proc` on a host, any directory in tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Procfs {
    root: PathBuf,
}

impl Procfs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Procfs { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/devices`: the character device list, where `nvidia-caps` has a dynamic major.
    pub fn devices_path(&self) -> PathBuf {
        self.root.join("devices")
    }

    /// `<root>/sys/kernel/random/boot_id`.
    pub fn boot_id_path(&self) -> PathBuf {
        self.root.join("sys/kernel/random/boot_id")
    }

    /// `<root>/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>` (`/ci<C>` below it for a CI).
    /// `<minor>` is the device minor, not the NVML index.
    pub fn gi_dir(&self, gpu_minor: u32, gi_id: u32) -> PathBuf {
        self.root.join(format!("driver/nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi_id}"))
    }

    /// The major of the `nvidia-caps` character devices.
    pub fn caps_major(&self) -> Result<u32> {
        let path = self.devices_path();
        let text = read(&path)?;
        parse_char_major(&text, "nvidia-caps").ok_or_else(|| GpuError::Procfs {
            path: path.display().to_string(),
            reason: "no nvidia-caps character device; is the nvidia driver loaded with MIG support?".into(),
        })
    }

    /// `nvidia-cap<N>` minors of a GI and of one of its CIs, from their `access` files.
    pub fn mig_capability_minors(&self, gpu_minor: u32, gi_id: u32, ci_id: u32) -> Result<(u32, u32)> {
        let gi = self.gi_dir(gpu_minor, gi_id);
        Ok((device_file_minor(&gi.join("access"))?, device_file_minor(&gi.join(format!("ci{ci_id}/access")))?))
    }

    /// The kernel's boot ID: MIG instances do not outlive it.
    pub fn boot_id(&self) -> Result<String> {
        let path = self.boot_id_path();
        let id = read(&path)?.trim().to_string();
        if id.is_empty() {
            return Err(GpuError::Procfs { path: path.display().to_string(), reason: "it is empty".into() });
        }
        Ok(id)
    }
}

impl Default for Procfs {
    fn default() -> Self {
        Procfs::new(HOST_ROOT)
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| GpuError::Procfs { path: path.display().to_string(), reason: e.to_string() })
}

fn device_file_minor(path: &Path) -> Result<u32> {
    let text = read(path)?;
    parse_device_file_minor(&text).ok_or_else(|| GpuError::Procfs {
        path: path.display().to_string(),
        reason: "no 'DeviceFileMinor: N' line".into(),
    })
}

/// The major of `name` in the "Character devices:" section of `/proc/devices`.
pub fn parse_char_major(text: &str, name: &str) -> Option<u32> {
    let mut in_char = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        let mut fields = line.split_whitespace();
        if let (Some(major), Some(dev), None) = (fields.next(), fields.next(), fields.next())
            && dev == name
        {
            return major.parse().ok();
        }
    }
    None
}

/// `N` from the `DeviceFileMinor: N` line of a capability `access` file.
pub fn parse_device_file_minor(text: &str) -> Option<u32> {
    text.lines().find_map(|l| l.trim().strip_prefix("DeviceFileMinor:")).and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEVICES: &str = "Character devices:\n  1 mem\n  4 /dev/vc/0\n195 nvidia-frontend\n\
                           237 nvidia-caps-imex-channels\n238 nvidia-caps\n508 nvidia-uvm\n\n\
                           Block devices:\n  7 loop\n238 nvidia-caps\n";

    #[test]
    fn the_caps_major_comes_from_the_character_section_only() {
        assert_eq!(parse_char_major(DEVICES, "nvidia-caps"), Some(238));
        assert_eq!(parse_char_major(DEVICES, "nvidia-uvm"), Some(508));
        assert_eq!(parse_char_major("Block devices:\n238 nvidia-caps\n", "nvidia-caps"), None);
        assert_eq!(parse_char_major("Character devices:\nx nvidia-caps\n", "nvidia-caps"), None);
        assert_eq!(parse_char_major("", "nvidia-caps"), None);
    }

    #[test]
    fn access_files_give_their_minor() {
        let text = "DeviceFileMinor: 12\nDeviceFileMode: 292\nDeviceFileModify: 1\n";
        assert_eq!(parse_device_file_minor(text), Some(12));
        assert_eq!(parse_device_file_minor("DeviceFileMode: 256\n"), None);
        assert_eq!(parse_device_file_minor("DeviceFileMinor: x\n"), None);
    }

    #[test]
    fn a_tree_is_read_and_missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = Procfs::new(dir.path());
        let err = p.caps_major().unwrap_err().to_string();
        assert!(err.contains("devices") && !err.contains('\n'), "{err}");
        std::fs::write(p.devices_path(), DEVICES).unwrap();
        assert_eq!(p.caps_major().unwrap(), 238);
        std::fs::write(p.devices_path(), "Character devices:\n  1 mem\n").unwrap();
        assert!(p.caps_major().unwrap_err().to_string().contains("nvidia-caps"));

        let gi = p.gi_dir(1, 3);
        std::fs::create_dir_all(gi.join("ci0")).unwrap();
        std::fs::write(gi.join("access"), "DeviceFileMinor: 165\nDeviceFileMode: 292\n").unwrap();
        std::fs::write(gi.join("ci0/access"), "DeviceFileMinor: 166\n").unwrap();
        assert_eq!(p.mig_capability_minors(1, 3, 0).unwrap(), (165, 166));
        let err = p.mig_capability_minors(1, 3, 1).unwrap_err().to_string();
        assert!(err.contains("gpu1/mig/gi3/ci1/access"), "{err}");

        assert!(p.boot_id().is_err());
        std::fs::create_dir_all(p.boot_id_path().parent().unwrap()).unwrap();
        std::fs::write(p.boot_id_path(), "\n").unwrap();
        assert!(p.boot_id().unwrap_err().to_string().contains("empty"));
        std::fs::write(p.boot_id_path(), "4e2c7d0a-0000-4000-8000-000000000001\n").unwrap();
        assert_eq!(p.boot_id().unwrap(), "4e2c7d0a-0000-4000-8000-000000000001");
        assert_eq!(Procfs::default().root(), Path::new("/proc"));
    }
}
