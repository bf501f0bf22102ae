//! What the checkpoint remembers about each claim, as serde records.
//!
//! Compatibility rules, so that files move freely between migdra versions (NVIDIA's driver broke
//! old checkpoints by adding fields, see `docs/facts/anchor-nvidia-dra.md` §3.1):
//! - every struct ignores fields it does not know (no `deny_unknown_fields`), so a file written by
//!   a newer migdra loads in an older one;
//! - every field added after format version 1 carries `#[serde(default)]`, so a file written by an
//!   older migdra loads in a newer one;
//! - a change an old reader would misread (a renamed field, a new [`ClaimState`] variant, a
//!   changed meaning) bumps [`super::CURRENT_VERSION`] and gets a step in [`super::format`]'s
//!   `migrate`.
//!
//! Fields are `camelCase` in the file, like the Kubernetes objects they come from.

use crate::claims::ClaimRef;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How far a claim got. Written before the step it names starts, so a crash leaves the claim in a
/// state that says what may be half done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClaimState {
    /// Prepare began: intents are recorded, instances may exist partly.
    PrepareStarted,
    /// Prepare finished: instances and CDI specs exist and were reported to the kubelet.
    PrepareCompleted,
    /// Unprepare began: instances and CDI specs may be partly gone.
    UnprepareStarted,
}

impl ClaimState {
    /// The name as written in the file (`PrepareStarted`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PrepareStarted => "PrepareStarted",
            Self::PrepareCompleted => "PrepareCompleted",
            Self::UnprepareStarted => "UnprepareStarted",
        }
    }
}

impl std::fmt::Display for ClaimState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who owns a MIG instance, and so who may destroy it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MigOwner {
    /// migdra created the instance for this claim and destroys it on unprepare.
    Dynamic,
    /// An administrator created it; migdra only hands it out and never destroys it.
    Static,
}

/// One MIG partition of a claim: the intent (written before any NVML call), then what NVML made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigRecord {
    pub owner: MigOwner,
    /// NVML's GPU instance profile ID (not an index).
    pub profile_id: u32,
    /// The profile name, e.g. `3g.40gb`.
    pub profile: String,
    /// Placement start, in memory slices.
    pub start: u32,
    /// Placement size, in memory slices.
    pub size: u32,
    /// GPU instance ID assigned by the driver; `None` until the instance exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi_id: Option<u32>,
    /// Compute instance ID; `None` until it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_id: Option<u32>,
    /// The MIG device UUID; `None` until known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Minor of `/dev/nvidia-caps/nvidia-cap<N>` for the GPU instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gi_cap_minor: Option<u32>,
    /// Minor of `/dev/nvidia-caps/nvidia-cap<N>` for the compute instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ci_cap_minor: Option<u32>,
}

impl MigRecord {
    /// The intent alone: what to create, before anything exists.
    pub fn intent(owner: MigOwner, profile_id: u32, profile: &str, start: u32, size: u32) -> Self {
        Self {
            owner,
            profile_id,
            profile: profile.to_string(),
            start,
            size,
            gi_id: None,
            ci_id: None,
            uuid: None,
            gi_cap_minor: None,
            ci_cap_minor: None,
        }
    }

    /// The same intent with nothing created: after a reboot, or once destroyed.
    pub fn forgotten(&self) -> Self {
        Self::intent(self.owner, self.profile_id, &self.profile, self.start, self.size)
    }
}

/// One allocated device of a claim: a whole GPU or one MIG partition on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRecord {
    /// The claim's requests this device satisfies (from the allocation).
    pub requests: Vec<String>,
    /// The pool (from the allocation).
    pub pool: String,
    /// The device name, e.g. `gpu-0-mig-3g40gb-9-4` (from the allocation).
    pub device: String,
    /// The parent GPU's UUID.
    pub gpu_uuid: String,
    /// The parent GPU's PCI bus ID, which survives a reboot when UUID lookups might not.
    pub pci_bus_id: String,
    /// The parent GPU's minor (`/dev/nvidia<minor>`).
    pub gpu_minor: u32,
    /// The parent GPU's NVML index.
    pub gpu_index: u32,
    /// The MIG partition; `None` for a whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigRecord>,
    /// Fully qualified CDI device IDs handed to the kubelet.
    pub cdi_ids: Vec<String>,
}

/// Everything migdra knows about one claim on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// For a claim made from a template, the pod's name for it
    /// (`resource.kubernetes.io/pod-claim-name`): where its containers find the device metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
    pub state: ClaimState,
    pub devices: Vec<DeviceRecord>,
    /// Set when the boot ID changed: instances are gone, the next prepare re-creates them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_recreate: bool,
    /// Last error of a failed prepare/unprepare, for `migdra claims`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl ClaimRecord {
    /// The claim this record is of, as errors and logs name it.
    pub fn claim(&self) -> ClaimRef {
        ClaimRef::new(&self.uid, &self.namespace, &self.name)
    }
}

/// A claim prepared for admin access (`adminAccess: true`, a monitoring pod): it holds a CDI
/// spec and nothing on the hardware, so it lives apart from [`ClaimRecord`]s. Whatever counts,
/// reserves or sweeps instances reads [`Checkpoint::claims`] and never sees it.
///
/// A migdra without this field ignores it, removes the claim's spec as stale at its recovery and
/// drops the record on its next write: the monitoring pod loses its spec, no instance is touched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdminRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The allocated devices, as named; `mig` is always `None`: admin access holds no partition,
    /// it sees the parent GPU and whatever instances exist on it.
    pub devices: Vec<DeviceRecord>,
}

impl AdminRecord {
    /// The claim this record is of, as errors and logs name it.
    pub fn claim(&self) -> ClaimRef {
        ClaimRef::new(&self.uid, &self.namespace, &self.name)
    }
}

/// The whole checkpoint: the boot it was written in, and every claim by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// `/proc/sys/kernel/random/boot_id` of the boot that wrote it; empty in a fresh checkpoint.
    pub boot_id: String,
    /// Claims by UID.
    pub claims: BTreeMap<String, ClaimRecord>,
    /// Admin-access claims by UID; a UID is in one map or the other, never both.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub admin: BTreeMap<String, AdminRecord>,
}

impl Checkpoint {
    /// An empty checkpoint stamped with `boot_id`.
    pub fn new(boot_id: impl Into<String>) -> Self {
        Checkpoint { boot_id: boot_id.into(), claims: BTreeMap::new(), admin: BTreeMap::new() }
    }

    /// Whether it holds no claims, admin ones included.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty() && self.admin.is_empty()
    }

    /// Whether the claim is held, for its instances or for admin access: its spec is no orphan.
    pub fn holds(&self, uid: &str) -> bool {
        self.claims.contains_key(uid) || self.admin.contains_key(uid)
    }

    /// Every MIG record of every claim, with its claim and device.
    pub fn mig_records(&self) -> impl Iterator<Item = (&ClaimRecord, &DeviceRecord, &MigRecord)> {
        self.claims.values().flat_map(|c| c.devices.iter().filter_map(move |d| d.mig.as_ref().map(|m| (c, d, m))))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A claim with one dynamic MIG device and one whole GPU.
    pub(crate) fn sample_claim(uid: &str) -> ClaimRecord {
        ClaimRecord {
            uid: uid.to_string(),
            namespace: "default".to_string(),
            name: format!("claim-{uid}"),
            pod_claim_name: None,
            state: ClaimState::PrepareCompleted,
            devices: vec![
                DeviceRecord {
                    requests: vec!["mig".to_string()],
                    pool: "node-a".to_string(),
                    device: "gpu-0-mig-3g40gb-9-4".to_string(),
                    gpu_uuid: "GPU-aaaa".to_string(),
                    pci_bus_id: "00000000:3B:00.0".to_string(),
                    gpu_minor: 0,
                    gpu_index: 0,
                    mig: Some(MigRecord {
                        owner: MigOwner::Dynamic,
                        profile_id: 9,
                        profile: "3g.40gb".to_string(),
                        start: 4,
                        size: 4,
                        gi_id: Some(2),
                        ci_id: Some(0),
                        uuid: Some("MIG-bbbb".to_string()),
                        gi_cap_minor: Some(21),
                        ci_cap_minor: Some(22),
                    }),
                    cdi_ids: vec![format!("mig.slinky.slurm.net/claim={uid}-gpu-0-mig-3g40gb-9-4")],
                },
                DeviceRecord {
                    requests: vec!["whole".to_string()],
                    pool: "node-a".to_string(),
                    device: "gpu-1".to_string(),
                    gpu_uuid: "GPU-cccc".to_string(),
                    pci_bus_id: "00000000:5E:00.0".to_string(),
                    gpu_minor: 1,
                    gpu_index: 1,
                    mig: None,
                    cdi_ids: vec![format!("mig.slinky.slurm.net/claim={uid}-gpu-1")],
                },
            ],
            needs_recreate: false,
            last_error: None,
        }
    }

    #[test]
    fn enums_use_the_documented_names() {
        assert_eq!(serde_json::to_string(&ClaimState::PrepareStarted).unwrap(), r#""PrepareStarted""#);
        assert_eq!(serde_json::to_string(&ClaimState::UnprepareStarted).unwrap(), r#""UnprepareStarted""#);
        assert_eq!(serde_json::to_string(&MigOwner::Static).unwrap(), r#""static""#);
        for s in [ClaimState::PrepareStarted, ClaimState::PrepareCompleted, ClaimState::UnprepareStarted] {
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{s}\""));
        }
    }

    #[test]
    fn records_round_trip_and_skip_empty_optionals() {
        let mut cp = Checkpoint::new("boot");
        cp.claims.insert("u1".to_string(), sample_claim("u1"));
        let text = serde_json::to_string(&cp).unwrap();
        assert!(!text.contains("needsRecreate") && !text.contains("lastError"), "{text}");
        assert!(!text.contains("podClaimName"), "{text}");
        assert!(text.contains("\"giCapMinor\":21"), "{text}");
        let back: Checkpoint = serde_json::from_str(&text).unwrap();
        assert_eq!(back, cp);
        assert_eq!(cp.mig_records().count(), 1);
    }

    #[test]
    fn admin_claims_are_optional_and_apart() {
        let old = r#"{"bootId":"b","claims":{}}"#;
        let cp: Checkpoint = serde_json::from_str(old).unwrap();
        assert!(cp.admin.is_empty() && cp.is_empty());
        let mut cp = Checkpoint::new("b");
        let mut devices = sample_claim("a").devices;
        devices.iter_mut().for_each(|d| d.mig = None);
        cp.admin.insert("a".into(), AdminRecord { uid: "a".into(), namespace: "m".into(), name: "x".into(), devices });
        let text = serde_json::to_string(&cp).unwrap();
        assert!(text.contains(r#""admin":{"a":"#), "{text}");
        assert_eq!(serde_json::from_str::<Checkpoint>(&text).unwrap(), cp);
        assert!(cp.holds("a") && !cp.holds("b") && !cp.is_empty());
        assert_eq!(cp.mig_records().count(), 0, "admin access holds no partition");
    }
}
