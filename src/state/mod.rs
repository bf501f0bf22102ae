//! The checkpoint: the durable record of every claim's progress on this node.
//!
//! The prepare engine writes a claim's intent (parent GPU UUID, PCI bus ID, profile, placement)
//! here **before** any NVML mutation, fills in what NVML made right after, and marks the claim
//! complete at the end; unprepare marks it before tearing down. So after a crash of migdra, the
//! kubelet or the node, the checkpoint says exactly which instances may exist and who owns them,
//! and startup recovery can finish or undo every half-done step.
//!
//! - [`record`]: the records ([`Checkpoint`], [`ClaimRecord`], ...) and their compatibility rules.
//! - [`format`](mod@format): the file's bytes: `{"version", "checksum", "checkpoint"}`, FNV-1a over the raw
//!   payload text, migration of older versions.
//! - [`store`]: [`CheckpointStore`], locked read-modify-write with atomic replacement; a bad file
//!   is moved aside at startup instead of stopping the daemon.
//!
//! The file is stamped with the boot ID ([`host_boot_id`]): MIG instances and CDI specs do not
//! survive a reboot, so a checkpoint from another boot describes instances that are gone.

pub mod format;
pub mod record;
pub mod store;

pub use format::CURRENT_VERSION;
pub use record::{AdminRecord, Checkpoint, ClaimRecord, ClaimState, DeviceRecord, MigOwner, MigRecord};
pub use store::{CheckpointStore, Loaded};

use std::io;
use std::path::{Path, PathBuf};

/// Errors of the checkpoint layer.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A file system operation failed.
    #[error("failed to {op} {}: {source}", .path.display())]
    Io { path: PathBuf, op: &'static str, source: io::Error },
    /// The checkpoint file exists but cannot be understood.
    #[error("checkpoint {} is corrupt: {reason}", .path.display())]
    Corrupt { path: PathBuf, reason: String },
    /// The records could not be encoded (serde_json never fails on them; kept for honesty).
    #[error("failed to encode the checkpoint: {0}")]
    Encode(#[source] serde_json::Error),
}

pub type Result<T, E = StateError> = std::result::Result<T, E>;

/// This boot's ID, from `<proc_root>/sys/kernel/random/boot_id` (pass `/proc` on a host, the
/// mounted host `/proc` in a container), trimmed.
///
/// # Errors
/// The file cannot be read, or it is empty (`InvalidData`).
pub fn host_boot_id(proc_root: &Path) -> io::Result<String> {
    let path = proc_root.join("sys/kernel/random/boot_id");
    let id = std::fs::read_to_string(&path)?.trim().to_string();
    if id.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{} is empty", path.display())));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_boot_id_reads_a_fake_proc_tree() {
        let proc_root = tempfile::tempdir().unwrap();
        let dir = proc_root.path().join("sys/kernel/random");
        assert_eq!(host_boot_id(proc_root.path()).unwrap_err().kind(), io::ErrorKind::NotFound);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("boot_id"), "  \n").unwrap();
        assert_eq!(host_boot_id(proc_root.path()).unwrap_err().kind(), io::ErrorKind::InvalidData);
        std::fs::write(dir.join("boot_id"), "0f5a2b8e-3c1d-4e7f-9a6b-1c2d3e4f5a6b\n").unwrap();
        assert_eq!(host_boot_id(proc_root.path()).unwrap(), "0f5a2b8e-3c1d-4e7f-9a6b-1c2d3e4f5a6b");
    }

    #[test]
    fn the_real_boot_id_is_readable_on_linux() {
        if Path::new("/proc/sys/kernel/random/boot_id").exists() {
            assert_eq!(host_boot_id(Path::new("/proc")).unwrap().len(), 36);
        }
    }

    #[test]
    fn io_errors_name_the_operation_and_path() {
        let e = StateError::Io { path: "/x/checkpoint.json".into(), op: "read", source: io::Error::other("EIO") };
        assert_eq!(e.to_string(), "failed to read /x/checkpoint.json: EIO");
    }
}
