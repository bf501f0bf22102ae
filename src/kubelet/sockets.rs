//! Unix sockets the kubelet talks to: created with mode 0600 in directories of mode 0750, a stale
//! socket of ours removed before binding, and the registration socket re-created if the kubelet
//! wipes its directory.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::net::UnixListener;

/// Socket paths of one plugin instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketPaths {
    /// `<plugin-dir>/dra.sock`, or `dra-<podUID>.sock`.
    pub dra: PathBuf,
    /// `<registry-dir>/<driver>-reg.sock`, or `<driver>-<podUID>-reg.sock`.
    pub registration: PathBuf,
}

/// The longest path a Unix socket may have on Linux: `sun_path` holds 108 bytes with its NUL.
pub const MAX_SOCKET_PATH: usize = 107;

/// How many characters of the pod UID name the sockets when the whole UID makes a path too long.
const SHORT_UID: usize = 8;

impl SocketPaths {
    /// With a pod UID, both names carry it, so an old and a new pod can be registered at once
    /// during a rolling upgrade. Under a long kubelet root dir (MicroK8s:
    /// `/var/snap/microk8s/common/var/lib/kubelet`) the whole UID would pass the socket path
    /// limit, which neither migdra nor the kubelet could bind or dial; then its first
    /// [`SHORT_UID`] characters name them, enough to tell two pods of one node apart. The same
    /// inputs always give the same paths, so `migdra probe` finds what `serve` bound.
    pub fn new(plugin_dir: &Path, registry_dir: &Path, driver: &str, pod_uid: Option<&str>) -> Self {
        match pod_uid.filter(|u| !u.is_empty()) {
            Some(uid) => {
                let full = Self::tagged(plugin_dir, registry_dir, driver, uid);
                if full.too_long().is_none() {
                    return full;
                }
                let short: String = uid.chars().take(SHORT_UID).collect();
                Self::tagged(plugin_dir, registry_dir, driver, &short)
            }
            None => {
                Self { dra: plugin_dir.join("dra.sock"), registration: registry_dir.join(format!("{driver}-reg.sock")) }
            }
        }
    }

    fn tagged(plugin_dir: &Path, registry_dir: &Path, driver: &str, tag: &str) -> Self {
        Self {
            dra: plugin_dir.join(format!("dra-{tag}.sock")),
            registration: registry_dir.join(format!("{driver}-{tag}-reg.sock")),
        }
    }

    /// The first of the two paths that is longer than a socket path may be.
    pub fn too_long(&self) -> Option<&Path> {
        [&self.dra, &self.registration]
            .into_iter()
            .find(|p| p.as_os_str().len() > MAX_SOCKET_PATH)
            .map(PathBuf::as_path)
    }
}

/// Bind a socket at `path`: create its directory (0750), remove a stale socket there, bind, and
/// set the socket's mode to 0600.
///
/// # Errors
/// Something other than a socket is at `path`, or the directory or socket cannot be made.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        crate::files::create_dir(dir, 0o750)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket; refusing to replace it", path.display()),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// The inode of the socket at `path`, to notice when it is deleted or replaced.
pub fn inode(path: &Path) -> Option<u64> {
    std::fs::symlink_metadata(path).ok().filter(|m| m.file_type().is_socket()).map(|m| m.ino())
}

/// Remove our socket, if it is still ours (same inode).
pub fn remove(path: &Path, ino: Option<u64>) {
    if ino.is_some() && inode(path) == ino {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_kubelet_root_dir_shortens_the_pod_uid_to_fit() {
        let uid = "c3ef4f6d-1be5-41ad-96c1-ead124a186ac";
        let driver = "mig.slinky.slurm.net";
        let at = |root: &str| {
            let root = Path::new(root);
            SocketPaths::new(&root.join("plugins").join(driver), &root.join("plugins_registry"), driver, Some(uid))
        };
        let p = at("/var/lib/kubelet");
        assert_eq!(p.registration, Path::new(&format!("/var/lib/kubelet/plugins_registry/{driver}-{uid}-reg.sock")));
        let p = at("/var/snap/microk8s/common/var/lib/kubelet");
        assert_eq!(
            p.registration,
            Path::new(
                "/var/snap/microk8s/common/var/lib/kubelet/plugins_registry/mig.slinky.slurm.net-c3ef4f6d-reg.sock"
            )
        );
        assert_eq!(
            p.dra,
            Path::new("/var/snap/microk8s/common/var/lib/kubelet/plugins/mig.slinky.slurm.net/dra-c3ef4f6d.sock")
        );
        assert!(p.too_long().is_none(), "{p:?}");
        let p = at(&format!("/{}", "x".repeat(120)));
        assert_eq!(p.too_long(), Some(p.dra.as_path()));
    }
}
