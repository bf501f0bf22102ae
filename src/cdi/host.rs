//! The host device nodes a spec names by path, checked before the spec is written.
//!
//! The container runtime copies such a node from the host when it creates a container: it
//! `lstat`s the path and refuses anything but a device node (container-device-interface
//! `deviceInfoFromPath`). A missing one fails only then, after the kubelet was told the prepare
//! succeeded, as `CDI device injection failed: … failed to stat CDI host device
//! "/dev/nvidiactl": no such file or directory`. Checked here, the prepare fails instead, with
//! a line that says what is missing and what it means. Nodes written with their numbers (the MIG
//! capability nodes) are made by the runtime and need nothing on the host.

use super::CdiDevice;
use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// A host node the runtime could not copy into the container.
#[derive(Debug, thiserror::Error)]
pub enum HostNodeError {
    #[error("{} does not exist: {}", path.display(), hint(path))]
    Missing { path: PathBuf },
    #[error("{} is {kind}, not a character device: {}", path.display(), hint(path))]
    NotCharDevice { path: PathBuf, kind: &'static str },
    #[error("cannot stat {}: {source}", path.display())]
    Stat {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Check that every node `devices` name by path is a character device under `root` (the host's
/// root as this process sees it: `/` in the DaemonSet's privileged container). The first one
/// that is not, in the order the spec lists them.
///
/// # Errors
/// A node is missing, is no character device, or cannot be looked at.
pub fn check(root: &Path, devices: &[CdiDevice]) -> Result<(), HostNodeError> {
    let mut seen = BTreeSet::new();
    let by_path = devices.iter().flat_map(|d| &d.device_nodes).filter(|n| n.major.is_none());
    for node in by_path.filter(|n| seen.insert(n.path.as_str())) {
        let path = root.join(node.path.trim_start_matches('/'));
        let kind = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_char_device() => continue,
            Ok(m) if m.file_type().is_symlink() => "a symbolic link",
            Ok(m) if m.is_dir() => "a directory",
            Ok(m) if m.is_file() => "a regular file",
            Ok(_) => "another kind of file",
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(HostNodeError::Missing { path }),
            Err(source) => return Err(HostNodeError::Stat { path, source }),
        };
        return Err(HostNodeError::NotCharDevice { path, kind });
    }
    Ok(())
}

/// What a missing or broken node means: the unified-memory nodes come with the nvidia-uvm
/// module, loaded apart from the driver; every other one with the driver itself.
fn hint(path: &Path) -> &'static str {
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    if name.starts_with("nvidia-uvm") {
        "is the nvidia-uvm module loaded on this node (nvidia-modprobe -u -c=0 loads it and makes the nodes)?"
    } else {
        "is the NVIDIA driver loaded on this node?"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::{gpu_device, mig_device};

    fn devices() -> Vec<CdiDevice> {
        vec![gpu_device("a".into(), 1, "GPU-1"), mig_device("b".into(), 0, "MIG-1", 12, 13, 508)]
    }

    #[test]
    fn a_missing_node_is_named_with_what_it_means() {
        let root = tempfile::tempdir().unwrap();
        let err = check(root.path(), &devices()).unwrap_err().to_string();
        let ctl = root.path().join("dev/nvidiactl");
        assert_eq!(err, format!("{} does not exist: is the NVIDIA driver loaded on this node?", ctl.display()));

        std::fs::create_dir(root.path().join("dev")).unwrap();
        std::fs::write(&ctl, "").unwrap();
        let err = check(root.path(), &devices()).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "{} is a regular file, not a character device: is the NVIDIA driver loaded on this node?",
                ctl.display()
            )
        );
        std::fs::remove_file(&ctl).unwrap();
        std::os::unix::fs::symlink("/dev/null", &ctl).unwrap();
        assert!(check(root.path(), &devices()).unwrap_err().to_string().contains("is a symbolic link"));
    }

    #[test]
    fn the_uvm_nodes_point_at_their_module() {
        let err = HostNodeError::Missing { path: "/dev/nvidia-uvm-tools".into() }.to_string();
        assert!(err.starts_with("/dev/nvidia-uvm-tools does not exist: is the nvidia-uvm module loaded"), "{err}");
    }

    #[test]
    fn character_devices_pass_and_numbered_nodes_are_not_looked_up() {
        use crate::cdi::DeviceNode;
        // /dev/null is a character device on every Linux machine; nothing is at the other path.
        let device = CdiDevice {
            name: "n".into(),
            env: Vec::new(),
            device_nodes: vec![
                DeviceNode::host("/dev/null"),
                DeviceNode::char_device("/dev/nvidia-caps/nvidia-cap999999", 508, 999_999, 0o444),
            ],
            mounts: Vec::new(),
        };
        check(Path::new("/"), &[device]).unwrap();
    }
}
