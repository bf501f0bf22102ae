//! The CDI spec file format, as far as migdra writes and reads it.
//!
//! Field names follow the CDI specification (cncf-tags/container-device-interface `SPEC.md`,
//! `specs-go/config.go`): camelCase JSON, `env` as `KEY=VALUE` strings, device nodes with
//! `path`/`type`/`major`/`minor`/`fileMode`/`permissions`, mounts with
//! `hostPath`/`containerPath`/`options`. Reading ignores every field migdra does not write (hooks,
//! annotations), so a spec edited by hand or by a newer migdra still parses.

use serde::{Deserialize, Serialize};

/// The `cdiVersion` migdra writes. Device names start with the claim UID, which may start with a
/// digit (allowed since 0.5.0); 0.6.0 is the floor the project settled on, read by the CDI
/// library from v0.6 on (containerd 2, CRI-O, and containerd 1.7 patch releases that vendor it).
pub const CDI_VERSION: &str = "0.6.0";

/// One CDI spec file: a kind (`vendor/class`) and its devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// CDI specification version of the file, e.g. `0.6.0`.
    pub cdi_version: String,
    /// `<vendor>/<class>`; migdra writes `<driver>/claim`.
    pub kind: String,
    /// The devices a container may ask for as `<kind>=<name>`.
    pub devices: Vec<SpecDevice>,
}

/// One device of a spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecDevice {
    /// Unqualified device name (`<claimUID>-<deviceName>` for migdra).
    pub name: String,
    /// What the runtime changes in the container for this device.
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

/// The container edits migdra uses: environment, device nodes and mounts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `KEY=VALUE` strings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes to create in the container and allow in its device cgroup.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<SpecDeviceNode>,
    /// Bind mounts; migdra's one is the device metadata file (KEP-5304).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<SpecMount>,
}

/// A mount as the spec file holds it (CDI `specs-go` `Mount`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecMount {
    pub host_path: String,
    pub container_path: String,
    /// Mount options, e.g. `ro`, `bind`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// A device node as the spec file holds it.
///
/// Without `type`/`major`/`minor` the runtime takes them from the host node at `path` (it must
/// exist there). With them, the runtime creates the node in the container as given, so the host
/// node need not exist; migdra uses that for the MIG capability nodes, which hosts often lack.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecDeviceNode {
    /// Path in the container (and on the host when `type` is absent).
    pub path: String,
    /// `c` (character), `b` (block) or `p` (FIFO).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Mode bits of the node in the container (JSON number, e.g. 292 for 0o444).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Cgroup access, `rwm` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

impl Spec {
    /// The device with this unqualified name.
    pub fn device(&self, name: &str) -> Option<&SpecDevice> {
        self.devices.iter().find(|d| d.name == name)
    }

    /// The fully qualified CDI IDs of the devices, `<kind>=<name>`, in file order.
    pub fn qualified_ids(&self) -> Vec<String> {
        self.devices.iter().map(|d| format!("{}={}", self.kind, d.name)).collect()
    }
}

impl SpecDevice {
    /// The value of an environment variable the device sets.
    pub fn env(&self, key: &str) -> Option<&str> {
        self.container_edits.env.iter().find_map(|kv| kv.split_once('=').filter(|(k, _)| *k == key).map(|(_, v)| v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_ignores_fields_migdra_does_not_write() {
        let text = r#"{
            "cdiVersion": "0.7.0",
            "kind": "mig.slinky.slurm.net/claim",
            "annotations": {"a": "b"},
            "containerEdits": {"env": ["X=1"]},
            "devices": [{
                "name": "u-gpu-0",
                "annotations": {"c": "d"},
                "containerEdits": {
                    "env": ["NVIDIA_VISIBLE_DEVICES=GPU-1", "EMPTY="],
                    "deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0", "uid": 0}],
                    "hooks": [{"hookName": "createContainer", "path": "/bin/true"}],
                    "mounts": [{"hostPath": "/a", "containerPath": "/b"}]
                }
            }]
        }"#;
        let spec: Spec = serde_json::from_str(text).unwrap();
        let dev = spec.device("u-gpu-0").unwrap();
        assert_eq!(dev.env("NVIDIA_VISIBLE_DEVICES"), Some("GPU-1"));
        assert_eq!(dev.env("EMPTY"), Some(""));
        assert_eq!(dev.env("NVIDIA"), None);
        assert_eq!(dev.container_edits.device_nodes[0].path, "/dev/nvidia0");
        assert_eq!(dev.container_edits.mounts[0].container_path, "/b");
        assert!(dev.container_edits.mounts[0].options.is_empty());
        assert_eq!(spec.qualified_ids(), ["mig.slinky.slurm.net/claim=u-gpu-0"]);
    }

    #[test]
    fn absent_node_fields_are_not_written() {
        let node = SpecDeviceNode { path: "/dev/nvidiactl".into(), ..Default::default() };
        assert_eq!(serde_json::to_string(&node).unwrap(), r#"{"path":"/dev/nvidiactl"}"#);
        let node = SpecDeviceNode {
            path: "/dev/nvidia-caps/nvidia-cap12".into(),
            kind: Some("c".into()),
            major: Some(508),
            minor: Some(0),
            file_mode: Some(0o444),
            permissions: None,
        };
        assert_eq!(
            serde_json::to_string(&node).unwrap(),
            r#"{"path":"/dev/nvidia-caps/nvidia-cap12","type":"c","major":508,"minor":0,"fileMode":292}"#
        );
    }
}
