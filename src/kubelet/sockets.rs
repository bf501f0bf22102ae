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

impl SocketPaths {
    /// With a pod UID, both names carry it, so an old and a new pod can be registered at once
    /// during a rolling upgrade.
    pub fn new(plugin_dir: &Path, registry_dir: &Path, driver: &str, pod_uid: Option<&str>) -> Self {
        match pod_uid.filter(|u| !u.is_empty()) {
            Some(uid) => Self {
                dra: plugin_dir.join(format!("dra-{uid}.sock")),
                registration: registry_dir.join(format!("{driver}-{uid}-reg.sock")),
            },
            None => {
                Self { dra: plugin_dir.join("dra.sock"), registration: registry_dir.join(format!("{driver}-reg.sock")) }
            }
        }
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
