//! Where prepare gets a claim's allocation.
//!
//! The kubelet's prepare request names a claim (UID, namespace, name) but not what the scheduler
//! allocated; that lives in the ResourceClaim's `status.allocation`. [`ClaimSource`] is the one
//! question prepare asks, so the API server, a directory of files ([`DirSource`], for `--claims-dir`
//! and tests) and test fakes are interchangeable. A source returns every allocation result, of
//! every driver; the caller keeps its own.

mod dir;
mod object;

pub use dir::{DirSource, Scan};
pub use object::{API_VERSIONS, FoundClaim};

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Errors of a claim source. Messages are one line and name the claim as `namespace/name (uid)`.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The request named the claim with a malformed namespace, name or UID.
    #[error("invalid claim {field} {value:?}: {expected}")]
    BadRef { field: &'static str, value: String, expected: &'static str },
    /// The claim exists but the scheduler has not allocated it.
    #[error("claim {claim} has no status.allocation yet (found in {origin})")]
    NotAllocated { claim: ClaimRef, origin: Origin },
    /// The UID belongs to another claim than the request names: one of another namespace/name,
    /// or (`found` with another UID) one deleted and re-created under the same name. `found` is
    /// boxed, keeping the error small enough to return by value.
    #[error("claim UID {} belongs to {}{} in {origin}, not to {}", expected.uid, found.namespaced_name(),
        recreated(expected, found), expected.namespaced_name())]
    Mismatch { expected: ClaimRef, found: Box<ClaimRef>, origin: Origin },
    /// Several files hold different objects with this UID.
    #[error("claim UID {uid} is in several files with different contents: {}", list_paths(files))]
    Ambiguous { uid: String, files: Vec<PathBuf> },
    /// No file holds the claim, but some files could not be parsed; one of them may have held it.
    #[error("claim UID {uid} not found in {}, and {} file(s) there could not be parsed: {}",
        dir.display(), errors.len(), list_errors(errors))]
    NotFound { uid: String, dir: PathBuf, errors: Vec<(PathBuf, String)> },
    /// The API server did not answer the lookup; `transient` when retrying may still succeed
    /// (a timeout, a 5xx, a 429), so the kubelet's next call can. The source is boxed so this
    /// module needs nothing of the client that made the call.
    #[error("failed to read claim {claim} from the API server{}: {source}",
        if *transient { " (transient, the kubelet's retry may succeed)" } else { "" })]
    Api {
        claim: ClaimRef,
        transient: bool,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The source could not be read at all.
    #[error("failed to {op} {}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Where a source found a claim: a file of a claims directory, or the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    File(PathBuf),
    ApiServer,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) => write!(f, "{}", path.display()),
            Self::ApiServer => f.write_str("API server"),
        }
    }
}

/// What [`ClaimError::Mismatch`] adds when the found claim has another UID than the expected one.
fn recreated(expected: &ClaimRef, found: &ClaimRef) -> String {
    if found.uid == expected.uid {
        return String::new();
    }
    format!(" with UID {} (the claim was re-created)", found.uid)
}

pub type Result<T, E = ClaimError> = std::result::Result<T, E>;

fn list_paths(files: &[PathBuf]) -> String {
    files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

fn list_errors(errors: &[(PathBuf, String)]) -> String {
    let each: Vec<String> = errors.iter().map(|(p, e)| format!("{}: {}", p.display(), e.replace('\n', " "))).collect();
    each.join("; ")
}

/// A claim as the kubelet names it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimRef {
    /// `metadata.uid`: the key every source matches on.
    pub uid: String,
    /// May be empty when unknown; then it is not checked.
    pub namespace: String,
    /// May be empty when unknown; then it is not checked.
    pub name: String,
}

/// One allocated device (`status.allocation.devices.results[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllocationResult {
    /// The claim's request this device satisfies (`main` or `main/sub`).
    pub request: String,
    /// The driver that owns the device; other drivers' results are not ours to prepare.
    pub driver: String,
    /// The ResourceSlice pool (migdra: the node name).
    pub pool: String,
    /// The device name, e.g. `gpu-0-mig-3g40gb-9-4`.
    pub device: String,
    /// Set when the device was allocated for admin access (monitoring beside other users).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_access: Option<bool>,
}

/// An allocated claim.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// UID, namespace and name as the object carries them.
    pub claim: ClaimRef,
    /// Every result of the allocation, of every driver, in order.
    pub results: Vec<AllocationResult>,
    /// The pod's name for a claim made from a template (annotation
    /// `resource.kubernetes.io/pod-claim-name`): where the device metadata goes in the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
}

/// Where prepare looks up a claim's allocation.
pub trait ClaimSource: Send + Sync {
    /// The allocated claim with this UID. `Ok(None)`: there is no such claim.
    ///
    /// # Errors
    /// [`ClaimError::BadRef`] for a malformed reference, [`ClaimError::NotAllocated`],
    /// [`ClaimError::Mismatch`] when the UID belongs to a claim of another namespace/name, and
    /// source-specific failures.
    fn get(&self, claim: &ClaimRef) -> Result<Option<Claim>>;
}

impl ClaimRef {
    pub fn new(uid: impl Into<String>, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { uid: uid.into(), namespace: namespace.into(), name: name.into() }
    }

    /// Check the fields a request carries before they are used anywhere.
    ///
    /// # Errors
    /// [`ClaimError::BadRef`]: an empty or non-`[a-z0-9-]{1,64}` UID, a non-empty namespace that is
    /// not a DNS label, a non-empty name that is not a DNS subdomain.
    pub fn validate(&self) -> Result<()> {
        let bad = |field, value: &str, expected| Err(ClaimError::BadRef { field, value: value.to_string(), expected });
        if !crate::names::is_uid(&self.uid) {
            return bad("UID", &self.uid, "expected 1 to 64 characters of [a-z0-9-] (a Kubernetes UID)");
        }
        if !self.namespace.is_empty() && !crate::names::is_dns_label(&self.namespace) {
            return bad(
                "namespace",
                &self.namespace,
                "expected a DNS label ([a-z0-9-], at most 63, no dash at the ends)",
            );
        }
        if !self.name.is_empty() && !crate::names::is_dns_subdomain(&self.name) {
            return bad(
                "name",
                &self.name,
                "expected a DNS subdomain (dot-separated [a-z0-9-] labels, at most 253 characters)",
            );
        }
        Ok(())
    }

    /// `namespace/name`, without the UID.
    pub fn namespaced_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// True when `other` (as found in a source) is the claim this reference names: same UID, and
    /// the same namespace and name where this reference carries them.
    pub fn matches(&self, other: &ClaimRef) -> bool {
        self.uid == other.uid
            && (self.namespace.is_empty() || self.namespace == other.namespace)
            && (self.name.is_empty() || self.name == other.name)
    }
}

/// `namespace/name (uid)`, the one way messages name a claim; the UID alone when neither the
/// namespace nor the name is known (an unprepare before the checkpoint is read, a claim rebuilt
/// from CDI specs alone).
impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespace.is_empty() && self.name.is_empty() {
            return f.write_str(&self.uid);
        }
        write!(f, "{} ({})", self.namespaced_name(), self.uid)
    }
}

impl Claim {
    /// The results of one driver, in order.
    pub fn results_for<'a>(&'a self, driver: &'a str) -> impl Iterator<Item = &'a AllocationResult> + 'a {
        self.results.iter().filter(move |r| r.driver == driver)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_are_validated() {
        let uid = "5f0c3b1e-8a0d-4c9e-9a55-2b7f0e4d6c11";
        assert!(ClaimRef::new(uid, "ml", "trainer-gpu-x7k2p").validate().is_ok());
        assert!(ClaimRef::new(uid, "", "").validate().is_ok());
        assert!(ClaimRef::new(uid, "a", "a.b-c.d").validate().is_ok());
        let long_name = "a".repeat(254);
        let cases = [
            (ClaimRef::new("", "ml", "x"), "UID"),
            (ClaimRef::new("../x", "ml", "x"), "UID"),
            (ClaimRef::new("A", "ml", "x"), "UID"),
            (ClaimRef::new(uid, "ML", "x"), "namespace"),
            (ClaimRef::new(uid, "a.b", "x"), "namespace"),
            (ClaimRef::new(uid, "-a", "x"), "namespace"),
            (ClaimRef::new(uid, "ml", "x/y"), "name"),
            (ClaimRef::new(uid, "ml", "a..b"), "name"),
            (ClaimRef::new(uid, "ml", "a."), "name"),
            (ClaimRef::new(uid, "ml", &long_name), "name"),
        ];
        for (r, field) in cases {
            let err = r.validate().unwrap_err();
            assert!(matches!(err, ClaimError::BadRef { field: f, .. } if f == field), "{r:?}: {err}");
        }
    }

    #[test]
    fn matching_ignores_unknown_namespace_and_name() {
        let found = ClaimRef::new("u", "ml", "c");
        assert!(ClaimRef::new("u", "", "").matches(&found));
        assert!(ClaimRef::new("u", "ml", "").matches(&found));
        assert!(ClaimRef::new("u", "ml", "c").matches(&found));
        assert!(!ClaimRef::new("u", "other", "c").matches(&found));
        assert!(!ClaimRef::new("u", "ml", "d").matches(&found));
        assert!(!ClaimRef::new("v", "ml", "c").matches(&found));
    }

    #[test]
    fn messages_name_the_claim_as_before() {
        let expected = ClaimRef::new("u", "ml", "c");
        let moved = ClaimError::Mismatch {
            expected: expected.clone(),
            found: Box::new(ClaimRef::new("u", "ml", "d")),
            origin: Origin::File("/claims/a.yaml".into()),
        };
        assert_eq!(moved.to_string(), "claim UID u belongs to ml/d in /claims/a.yaml, not to ml/c");
        let recreated = ClaimError::Mismatch {
            expected: expected.clone(),
            found: Box::new(ClaimRef::new("v", "ml", "c")),
            origin: Origin::ApiServer,
        };
        assert_eq!(
            recreated.to_string(),
            "claim UID u belongs to ml/c with UID v (the claim was re-created) in API server, not to ml/c"
        );
        let pending = ClaimError::NotAllocated { claim: expected, origin: Origin::ApiServer };
        assert_eq!(pending.to_string(), "claim ml/c (u) has no status.allocation yet (found in API server)");
        assert_eq!(ClaimRef::new("u", "", "").to_string(), "u", "nothing but the UID is known");
    }

    #[test]
    fn not_found_is_one_line() {
        let err = ClaimError::NotFound {
            uid: "u".into(),
            dir: "/claims".into(),
            errors: vec![("/claims/a.yaml".into(), "bad\nyaml".into()), ("/claims/b.json".into(), "eof".into())],
        };
        let text = err.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(text.contains("/claims/a.yaml: bad yaml; /claims/b.json: eof"), "{text}");
    }
}
