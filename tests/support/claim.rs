//! ResourceClaims as the API server returns them (for claim files and the fake API server), and
//! the reference the kubelet sends for one.

use super::{DRIVER, NAMESPACE};
use migdra::claims::ClaimRef;
use serde_json::{Value, json};

/// A claim UID, distinct per `n`.
pub fn uid(n: u32) -> String {
    format!("0d6f6a52-3c9e-4b8e-9a0c-{n:012}")
}

/// What the kubelet sends for the claim `Claim::new(uid)` describes: `claim-<uid>` in
/// [`NAMESPACE`].
pub fn claim_ref(uid: &str) -> ClaimRef {
    Claim::new(uid).reference()
}

/// One ResourceClaim, allocated (or not) by its results.
#[derive(Debug, Clone)]
pub struct Claim {
    pub uid: String,
    pub name: String,
    pub namespace: String,
    results: Vec<Value>,
}

impl Claim {
    /// Claim `uid`, named `claim-<uid>` in [`NAMESPACE`], with no allocation.
    pub fn new(uid: impl Into<String>) -> Self {
        let uid = uid.into();
        Self { name: format!("claim-{uid}"), uid, namespace: NAMESPACE.into(), results: Vec::new() }
    }

    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Allocated `device` of [`DRIVER`] in the pool of node `pool`, for the request `gpu`.
    pub fn device(self, pool: &str, device: &str) -> Self {
        self.result(json!({"request": "gpu", "driver": DRIVER, "pool": pool, "device": device}))
    }

    /// One allocation result as given, another driver's or a broken one.
    pub fn result(mut self, result: Value) -> Self {
        self.results.push(result);
        self
    }

    /// The object: one request `gpu` of DeviceClass `mig`, and the results as its allocation.
    pub fn object(&self) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig"}}]}},
            "status": {"allocation": {"devices": {"results": self.results}}}
        })
    }

    /// What the kubelet sends for this claim.
    pub fn reference(&self) -> ClaimRef {
        ClaimRef { uid: self.uid.clone(), namespace: self.namespace.clone(), name: self.name.clone() }
    }
}
