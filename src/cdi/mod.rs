//! CDI spec files: how a prepared device reaches the container.
//!
//! The kubelet hands the container runtime fully qualified CDI device IDs
//! (`<driver>/claim=<claimUID>-<deviceName>`); the runtime looks them up in the spec files of the CDI
//! directory and applies their edits. migdra writes one spec per claim, so unprepare removes exactly
//! that claim's file, and a lost checkpoint can be rebuilt from the files that remain
//! ([`CdiWriter::list`]). A MIG device exposes only its parent's `/dev/nvidia<minor>`, the GI and CI
//! capability nodes and the control nodes, and names the MIG UUID in `NVIDIA_VISIBLE_DEVICES` and
//! `CUDA_VISIBLE_DEVICES`: the container can reach no other GPU or MIG device.
//!
//! Every path built from claim data is checked first: a claim UID must be `[a-z0-9-]{1,64}`, so no
//! spec can land outside the directory.
//!
//! The first device of each request also bind-mounts that request's device metadata file
//! ([`metadata`], KEP-5304) read-only at its well-known container path.
//!
//! The host nodes a spec names by path must exist before it is written ([`host`]): the runtime
//! fails the container otherwise, long after the prepare reported success.

pub mod host;
pub mod metadata;
mod spec;
mod writer;

pub use spec::{CDI_VERSION, ContainerEdits, Spec, SpecDevice, SpecDeviceNode, SpecMount};
pub use writer::{CdiWriter, SpecState, Unreadable};

use std::path::PathBuf;

/// Errors of the CDI layer.
#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    /// A claim UID that would not make a safe file name.
    #[error("invalid claim UID {uid:?}: expected 1 to 64 characters of [a-z0-9-] (a Kubernetes UID)")]
    BadClaimUid { uid: String },
    /// A driver name that is not a valid CDI vendor name.
    #[error(
        "invalid driver name {driver:?} for a CDI kind: expected a letter first, then letters, \
         digits, '_', '-' or '.', ending in a letter or digit"
    )]
    BadDriver { driver: String },
    /// A device that the spec cannot hold.
    #[error("invalid CDI device {name:?}: {reason}")]
    BadDevice { name: String, reason: String },
    /// A claim spec must expose at least one device.
    #[error("no devices to write for claim {uid}")]
    NoDevices { uid: String },
    /// A file operation failed.
    #[error("failed to {op} {}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A name that would not make a safe metadata path.
    #[error("invalid {field} {value:?} for a device metadata path: expected {expected}")]
    BadMetadataName { field: &'static str, value: String, expected: &'static str },
    /// A spec file that is not a CDI spec of this driver.
    #[error("failed to parse CDI spec {}: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
}

pub type Result<T, E = CdiError> = std::result::Result<T, E>;

/// A device node to expose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// Absolute path in the container.
    pub path: String,
    /// With `minor`: the node is written as a character device with these numbers, so the runtime
    /// creates it even where the host has no such node. Without: the runtime copies the host node.
    pub major: Option<u32>,
    pub minor: Option<u32>,
    /// Mode bits of the node in the container; the runtime's default when `None`.
    pub file_mode: Option<u32>,
}

impl DeviceNode {
    /// A node the runtime copies from the host.
    pub fn host(path: impl Into<String>) -> Self {
        Self { path: path.into(), major: None, minor: None, file_mode: None }
    }

    /// A character device with explicit numbers and mode.
    pub fn char_device(path: impl Into<String>, major: u32, minor: u32, file_mode: u32) -> Self {
        Self { path: path.into(), major: Some(major), minor: Some(minor), file_mode: Some(file_mode) }
    }
}

/// A read-only bind mount of one host file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Absolute path on the host, as the runtime sees it.
    pub host_path: String,
    /// Absolute path in the container.
    pub container_path: String,
}

/// Options of every mount migdra writes: the container reads the file and cannot change it.
pub const MOUNT_OPTIONS: [&str; 2] = ["ro", "bind"];

/// One device of a claim's spec, before it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CdiDevice {
    /// Unqualified CDI device name, see [`device_name`].
    pub name: String,
    /// Environment variables, in order.
    pub env: Vec<(String, String)>,
    pub device_nodes: Vec<DeviceNode>,
    /// Files bind-mounted read-only; see [`with_mount`].
    pub mounts: Vec<Mount>,
}

/// The control nodes every GPU or MIG device needs: the driver's control node and unified memory.
pub const CONTROL_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// Mode of the MIG capability nodes in the container: read-only is enough to use the instance.
pub const CAP_FILE_MODE: u32 = 0o444;

/// The CDI device name of a claim's device: `<claimUID>-<deviceName>`.
///
/// The UID prefix keeps two claims that were given the same DRA device apart (admin access,
/// a claim re-created before the old one was unprepared).
pub fn device_name(claim_uid: &str, device: &str) -> String {
    format!("{claim_uid}-{device}")
}

/// The DRA device name inside a CDI device name of this claim (inverse of [`device_name`]).
pub fn split_device_name<'a>(claim_uid: &str, cdi_name: &'a str) -> Option<&'a str> {
    cdi_name.strip_prefix(claim_uid)?.strip_prefix('-').filter(|d| !d.is_empty())
}

/// The edits for one MIG device.
///
/// Only the parent GPU's node and this instance's GI and CI capability nodes are exposed, so the
/// container sees its MIG device and nothing else. The capability nodes carry their numbers (the
/// `nvidia-caps` major from `/proc/devices`, minors from
/// `/proc/driver/nvidia/capabilities/gpu<parent>/mig/gi<G>[/ci<C>]/access`), because the host
/// rarely has them under `/dev/nvidia-caps`.
pub fn mig_device(
    name: String,
    parent_minor: u32,
    mig_uuid: &str,
    gi_cap_minor: u32,
    ci_cap_minor: u32,
    caps_major: u32,
) -> CdiDevice {
    let mut device_nodes: Vec<DeviceNode> = CONTROL_NODES.iter().map(|p| DeviceNode::host(*p)).collect();
    device_nodes.push(DeviceNode::host(format!("/dev/nvidia{parent_minor}")));
    for minor in [gi_cap_minor, ci_cap_minor] {
        device_nodes.push(DeviceNode::char_device(cap_path(minor), caps_major, minor, CAP_FILE_MODE));
    }
    CdiDevice { name, env: visible_devices(mig_uuid), device_nodes, mounts: Vec::new() }
}

/// The edits for a whole GPU.
pub fn gpu_device(name: String, minor: u32, gpu_uuid: &str) -> CdiDevice {
    let mut device_nodes: Vec<DeviceNode> = CONTROL_NODES.iter().map(|p| DeviceNode::host(*p)).collect();
    device_nodes.push(DeviceNode::host(format!("/dev/nvidia{minor}")));
    CdiDevice { name, env: visible_devices(gpu_uuid), device_nodes, mounts: Vec::new() }
}

/// Add a read-only bind mount of `host_path` at `container_path` to a device's edits: how a
/// request's device metadata file reaches the containers that use the request.
pub fn with_mount(mut device: CdiDevice, host_path: &std::path::Path, container_path: &str) -> CdiDevice {
    device
        .mounts
        .push(Mount { host_path: host_path.display().to_string(), container_path: container_path.to_string() });
    device
}

/// The container variable, set to `true`, that marks a spec device made for admin access (written
/// into specs, never read from migdra's own environment): how a lost checkpoint rebuilt from the
/// specs tells the claim apart, and how the monitoring container knows it sees the whole GPU.
pub const ADMIN_VAR: &str = "MIGDRA_ADMIN_ACCESS";

/// The capability minors of one existing MIG instance (GI and CI), as the admin spec exposes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceCaps {
    pub gi_cap_minor: u32,
    pub ci_cap_minor: u32,
}

/// The edits for admin access to a GPU (a monitoring pod): its node, the control nodes, and the
/// GI and CI capability nodes of every instance that exists on it now, built as for
/// [`mig_device`]. `NVIDIA_VISIBLE_DEVICES` and `CUDA_VISIBLE_DEVICES` name the GPU.
pub fn admin_device(
    name: String,
    gpu_minor: u32,
    gpu_uuid: &str,
    instances: &[InstanceCaps],
    caps_major: u32,
) -> CdiDevice {
    let mut d = gpu_device(name, gpu_minor, gpu_uuid);
    for i in instances {
        for minor in [i.gi_cap_minor, i.ci_cap_minor] {
            d.device_nodes.push(DeviceNode::char_device(cap_path(minor), caps_major, minor, CAP_FILE_MODE));
        }
    }
    d.env.push((ADMIN_VAR.to_string(), "true".to_string()));
    d
}

/// `/dev/nvidia-caps/nvidia-cap<minor>`.
pub fn cap_path(minor: u32) -> String {
    format!("/dev/nvidia-caps/nvidia-cap{minor}")
}

fn visible_devices(uuid: &str) -> Vec<(String, String)> {
    ["NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"].iter().map(|k| (k.to_string(), uuid.to_string())).collect()
}

/// A CDI device name: letters, digits, `_`, `-`, `.`, `:`, starting and ending with a letter or
/// digit (CDI `parser.ValidateDeviceName`).
pub fn is_valid_device_name(name: &str) -> bool {
    let b = name.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.' | b':');
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric() && b.iter().all(inner)
        }
        _ => false,
    }
}

/// A CDI vendor name: a letter first, then letters, digits, `_`, `-`, `.`, ending in a letter or
/// digit (CDI `parser.ValidateVendorName`). The driver name is the vendor of migdra's kind.
pub fn is_valid_vendor(vendor: &str) -> bool {
    let b = vendor.as_bytes();
    let inner = |c: &u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.');
    match (b.first(), b.last()) {
        (Some(first), Some(last)) => first.is_ascii_alphabetic() && last.is_ascii_alphanumeric() && b.iter().all(inner),
        _ => false,
    }
}

impl CdiDevice {
    /// Check what the spec format and the runtime require.
    ///
    /// # Errors
    /// [`CdiError::BadDevice`] naming the first problem.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(CdiError::BadDevice { name: self.name.clone(), reason });
        if !is_valid_device_name(&self.name) {
            return bad("a CDI device name is letters, digits, '_', '-', '.' and ':', starting and ending \
                        with a letter or digit"
                .into());
        }
        for (k, v) in &self.env {
            let key_ok = !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !key_ok {
                return bad(format!("environment variable name {k:?} must be letters, digits and '_'"));
            }
            if v.contains('\0') {
                return bad(format!("environment variable {k} has a NUL byte in its value"));
            }
        }
        for m in &self.mounts {
            for p in [&m.host_path, &m.container_path] {
                if !is_clean_absolute(p) {
                    return bad(format!("mount path {p:?} must be absolute, without '..' or NUL"));
                }
            }
        }
        for node in &self.device_nodes {
            let p = &node.path;
            if !is_clean_absolute(p) {
                return bad(format!("device node path {p:?} must be absolute, without '..' or NUL"));
            }
            if node.major.is_some() != node.minor.is_some() {
                return bad(format!("device node {p} needs both major and minor, or neither"));
            }
        }
        Ok(())
    }

    fn to_spec(&self) -> SpecDevice {
        let device_nodes = self
            .device_nodes
            .iter()
            .map(|n| SpecDeviceNode {
                path: n.path.clone(),
                kind: n.major.map(|_| "c".to_string()),
                major: n.major.map(i64::from),
                minor: n.minor.map(i64::from),
                file_mode: n.file_mode,
                permissions: None,
            })
            .collect();
        let env = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mounts = self
            .mounts
            .iter()
            .map(|m| SpecMount {
                host_path: m.host_path.clone(),
                container_path: m.container_path.clone(),
                options: MOUNT_OPTIONS.map(String::from).to_vec(),
            })
            .collect();
        SpecDevice { name: self.name.clone(), container_edits: ContainerEdits { env, device_nodes, mounts } }
    }
}

fn is_clean_absolute(p: &str) -> bool {
    p.starts_with('/') && !p.contains('\0') && !p.split('/').any(|c| c == "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "MIG-5c0a1d2e-3f4b-5a6c-8d7e-9f0a1b2c3d4e";

    fn paths(d: &CdiDevice) -> Vec<&str> {
        d.device_nodes.iter().map(|n| n.path.as_str()).collect()
    }

    #[test]
    fn a_mig_device_exposes_only_its_parent_and_its_caps() {
        let d = mig_device("u-gpu-3-mig-3g40gb-9-4".into(), 3, UUID, 30, 31, 508);
        assert!(d.validate().is_ok());
        assert_eq!(
            paths(&d),
            [
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia3",
                "/dev/nvidia-caps/nvidia-cap30",
                "/dev/nvidia-caps/nvidia-cap31",
            ]
        );
        let gpu_nodes: Vec<&str> = paths(&d)
            .into_iter()
            .filter(|p| p.strip_prefix("/dev/nvidia").is_some_and(|n| n.parse::<u32>().is_ok()))
            .collect();
        assert_eq!(gpu_nodes, ["/dev/nvidia3"]);
        for cap in &d.device_nodes[4..] {
            assert_eq!((cap.major, cap.file_mode), (Some(508), Some(0o444)));
        }
        assert_eq!(d.device_nodes[4].minor, Some(30));
        assert_eq!(d.device_nodes[5].minor, Some(31));
        assert!(d.device_nodes[..4].iter().all(|n| n.major.is_none() && n.minor.is_none()));
        assert_eq!(
            d.env,
            [("NVIDIA_VISIBLE_DEVICES".to_string(), UUID.to_string()), ("CUDA_VISIBLE_DEVICES".into(), UUID.into())]
        );
    }

    #[test]
    fn a_gpu_device_exposes_its_node_and_the_control_nodes() {
        let d = gpu_device("u-gpu-7".into(), 7, "GPU-1");
        assert_eq!(paths(&d), ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia7"]);
        assert_eq!(d.env[0], ("NVIDIA_VISIBLE_DEVICES".into(), "GPU-1".into()));
        assert_eq!(d.env[1], ("CUDA_VISIBLE_DEVICES".into(), "GPU-1".into()));
    }

    #[test]
    fn an_admin_device_exposes_the_gpu_and_every_instance() {
        let caps =
            [InstanceCaps { gi_cap_minor: 12, ci_cap_minor: 13 }, InstanceCaps { gi_cap_minor: 30, ci_cap_minor: 31 }];
        let d = admin_device("u-gpu-0-mig-1g10gb-19-0".into(), 0, "GPU-1", &caps, 508);
        assert!(d.validate().is_ok());
        assert_eq!(
            paths(&d),
            [
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia0",
                "/dev/nvidia-caps/nvidia-cap12",
                "/dev/nvidia-caps/nvidia-cap13",
                "/dev/nvidia-caps/nvidia-cap30",
                "/dev/nvidia-caps/nvidia-cap31",
            ]
        );
        assert!(d.device_nodes[4..].iter().all(|n| n.major == Some(508) && n.file_mode == Some(CAP_FILE_MODE)));
        assert_eq!(d.env[0], ("NVIDIA_VISIBLE_DEVICES".into(), "GPU-1".into()));
        assert_eq!(d.env.last().unwrap(), &(ADMIN_VAR.to_string(), "true".to_string()));
        let bare = admin_device("u-gpu-1".into(), 1, "GPU-2", &[], 508);
        assert_eq!(paths(&bare), paths(&gpu_device("u-gpu-1".into(), 1, "GPU-2")));
    }

    #[test]
    fn device_names_carry_the_claim_uid() {
        let uid = "0b6f4a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
        let name = device_name(uid, "gpu-0-mig-3g40gb-9-4");
        assert_eq!(name, "0b6f4a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b-gpu-0-mig-3g40gb-9-4");
        assert!(is_valid_device_name(&name));
        assert_eq!(split_device_name(uid, &name), Some("gpu-0-mig-3g40gb-9-4"));
        assert_eq!(split_device_name("other", &name), None);
        assert_eq!(split_device_name(uid, uid), None);
    }

    #[test]
    fn cdi_name_rules() {
        for good in ["a", "0", "a-b_c.d:e", "0b6f-gpu-0"] {
            assert!(is_valid_device_name(good), "{good}");
        }
        for bad in ["", "-a", "a-", "a/b", "a=b", "a b", "é"] {
            assert!(!is_valid_device_name(bad), "{bad}");
        }
        for good in ["mig.slinky.slurm.net", "k8s.gpu.nvidia.com", "a", "A_b-c"] {
            assert!(is_valid_vendor(good), "{good}");
        }
        for bad in ["", "1a", "a.", "a/b", "-a", "a b"] {
            assert!(!is_valid_vendor(bad), "{bad}");
        }
        for good in ["0b6f4a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b", "a", "uid-1"] {
            assert!(crate::names::is_uid(good), "{good}");
        }
        for bad in ["", "A", "../x", "a/b", "a\0b", ".", "..", &"a".repeat(65), &"a".repeat(300)] {
            assert!(!crate::names::is_uid(bad), "{bad:?}");
        }
    }

    #[test]
    fn invalid_devices_are_refused_with_the_reason() {
        let ok = gpu_device("u-gpu-0".into(), 0, "GPU-1");
        let cases: Vec<(CdiDevice, &str)> = vec![
            (CdiDevice { name: "-x".into(), ..ok.clone() }, "CDI device name"),
            (CdiDevice { env: vec![("A=B".into(), "1".into())], ..ok.clone() }, "environment variable name"),
            (CdiDevice { env: vec![("A".into(), "1\0".into())], ..ok.clone() }, "NUL"),
            (CdiDevice { device_nodes: vec![DeviceNode::host("dev/x")], ..ok.clone() }, "absolute"),
            (CdiDevice { device_nodes: vec![DeviceNode::host("/dev/../etc")], ..ok.clone() }, "absolute"),
            (
                CdiDevice {
                    device_nodes: vec![DeviceNode { major: Some(1), ..DeviceNode::host("/dev/x") }],
                    ..ok.clone()
                },
                "both major and minor",
            ),
            (with_mount(ok.clone(), std::path::Path::new("rel/m.json"), "/m.json"), "mount path"),
            (with_mount(ok.clone(), std::path::Path::new("/m.json"), "/a/../m.json"), "mount path"),
        ];
        for (device, want) in cases {
            let err = device.validate().unwrap_err();
            assert!(matches!(err, CdiError::BadDevice { .. }), "{err}");
            assert!(err.to_string().contains(want), "{err} lacks {want}");
        }
    }

    #[test]
    fn a_mount_is_read_only_bind_in_the_spec() {
        let d = with_mount(gpu_device("u-gpu-0".into(), 0, "GPU-1"), std::path::Path::new("/h/m.json"), "/c/m.json");
        assert!(d.validate().is_ok());
        let m = &d.to_spec().container_edits.mounts;
        assert_eq!(
            serde_json::to_value(m).unwrap(),
            serde_json::json!([{"hostPath": "/h/m.json", "containerPath": "/c/m.json", "options": ["ro", "bind"]}])
        );
    }

    #[test]
    fn char_nodes_become_type_c_in_the_spec() {
        let d = mig_device("u-m".into(), 0, UUID, 12, 13, 238).to_spec();
        let caps: Vec<&SpecDeviceNode> = d.container_edits.device_nodes.iter().filter(|n| n.kind.is_some()).collect();
        assert_eq!(caps.len(), 2);
        assert_eq!(caps[0].kind.as_deref(), Some("c"));
        assert_eq!((caps[0].major, caps[0].minor, caps[0].file_mode), (Some(238), Some(12), Some(0o444)));
        assert_eq!(d.container_edits.env[0], format!("NVIDIA_VISIBLE_DEVICES={UUID}"));
    }
}
