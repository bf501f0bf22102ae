//! ResourceClaim objects in files, as the API server and `kubectl get -o json|yaml` print them.
//!
//! Only `metadata.{uid,namespace,name}`, the pod-claim-name annotation and
//! `status.allocation.devices.results[]` are read; every
//! other field is ignored, so claims of newer API servers (extra result fields, tolerations,
//! binding conditions) still parse. A file holds one object, a `List` of objects, or (YAML) several
//! documents; objects of other kinds are skipped.

use super::{AllocationResult, ClaimRef};
use serde::Deserialize;
use serde_json::Value;

/// API versions whose `status.allocation.devices.results[]` has the shape migdra reads.
pub const API_VERSIONS: [&str; 3] = ["resource.k8s.io/v1", "resource.k8s.io/v1beta2", "resource.k8s.io/v1beta1"];

/// A ResourceClaim found in a source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundClaim {
    pub claim: ClaimRef,
    /// `status.allocation.devices.results`; `None` when the claim has no allocation.
    pub results: Option<Vec<AllocationResult>>,
    /// The pod's name for a claim made from a template.
    pub pod_claim_name: Option<String>,
}

#[derive(Deserialize)]
struct RawClaim {
    metadata: RawMeta,
    #[serde(default)]
    status: Option<RawStatus>,
}

#[derive(Deserialize)]
struct RawMeta {
    uid: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    annotations: Option<std::collections::BTreeMap<String, String>>,
}

#[derive(Deserialize)]
struct RawStatus {
    #[serde(default)]
    allocation: Option<RawAllocation>,
}

#[derive(Deserialize)]
struct RawAllocation {
    #[serde(default)]
    devices: Option<RawDevices>,
}

#[derive(Deserialize)]
struct RawDevices {
    #[serde(default)]
    results: Option<Vec<AllocationResult>>,
}

/// The file formats a claims directory may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

/// The claims in a file's text, and one error per document or object that could not be read.
pub fn parse(text: &str, format: Format) -> (Vec<FoundClaim>, Vec<String>) {
    let mut found = Vec::new();
    let mut errors = Vec::new();
    match format {
        Format::Json => match serde_json::from_str::<Value>(text) {
            Ok(v) => collect(v, None, &mut found, &mut errors),
            Err(e) => errors.push(e.to_string()),
        },
        Format::Yaml => {
            for (i, doc) in serde_norway::Deserializer::from_str(text).enumerate() {
                match Value::deserialize(doc) {
                    Ok(v) => collect(v, None, &mut found, &mut errors),
                    // After a syntax error the stream keeps yielding the same error: stop there.
                    Err(e) => {
                        errors.push(format!("document {}: {e}", i + 1));
                        break;
                    }
                }
            }
        }
    }
    (found, errors)
}

/// Walk one object. `inherited` is (kind, apiVersion) for the items of a typed list
/// (`ResourceClaimList`), whose items the API server prints without them.
fn collect(v: Value, inherited: Option<(&str, &str)>, found: &mut Vec<FoundClaim>, errors: &mut Vec<String>) {
    if v.is_null() {
        return; // an empty YAML document
    }
    let Value::Object(mut obj) = v else {
        errors.push("not a Kubernetes object (expected a mapping with apiVersion and kind)".into());
        return;
    };
    let field = |k: &str| obj.get(k).and_then(Value::as_str).map(str::to_string);
    let kind = field("kind").or(inherited.map(|i| i.0.to_string())).unwrap_or_default();
    let api_version = field("apiVersion").or(inherited.map(|i| i.1.to_string())).unwrap_or_default();
    if kind.ends_with("List") {
        let Some(Value::Array(items)) = obj.remove("items") else {
            errors.push(format!("{kind} without an items array"));
            return;
        };
        let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
        for item in items {
            collect(item, item_kind.map(|k| (k, api_version.as_str())), found, errors);
        }
        return;
    }
    if kind != "ResourceClaim" {
        return;
    }
    let meta = |k: &str| obj.get("metadata").and_then(|m| m.get(k)).and_then(Value::as_str).unwrap_or("?");
    let what = format!("ResourceClaim {}/{}", meta("namespace"), meta("name"));
    if !API_VERSIONS.contains(&api_version.as_str()) {
        errors.push(format!("{what} has apiVersion {api_version:?}; expected one of {}", API_VERSIONS.join(", ")));
        return;
    }
    match serde_json::from_value::<RawClaim>(Value::Object(obj)) {
        Ok(raw) => found.push(FoundClaim {
            claim: ClaimRef {
                uid: raw.metadata.uid,
                namespace: raw.metadata.namespace.unwrap_or_default(),
                name: raw.metadata.name.unwrap_or_default(),
            },
            pod_claim_name: raw
                .metadata
                .annotations
                .and_then(|mut a| a.remove(crate::cdi::metadata::POD_CLAIM_NAME_ANNOTATION)),
            results: raw
                .status
                .and_then(|s| s.allocation)
                .map(|a| a.devices.and_then(|d| d.results).unwrap_or_default()),
        }),
        Err(e) => errors.push(format!("{what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> (Vec<FoundClaim>, Vec<String>) {
        parse(text, Format::Json)
    }

    #[test]
    fn a_minimal_claim_parses() {
        let (found, errors) = json(
            r#"{"apiVersion":"resource.k8s.io/v1beta1","kind":"ResourceClaim",
                "metadata":{"uid":"u","namespace":"n","name":"c"},
                "status":{"allocation":{"devices":{"results":[
                    {"request":"r","driver":"d","pool":"p","device":"x","adminAccess":null}]}}}}"#,
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(found[0].claim, ClaimRef::new("u", "n", "c"));
        let results = found[0].results.as_ref().unwrap();
        assert_eq!((results[0].device.as_str(), results[0].admin_access), ("x", None));
    }

    #[test]
    fn an_allocation_without_devices_has_no_results() {
        let (found, _) = json(
            r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"uid":"u"},
                "status":{"allocation":{}}}"#,
        );
        assert_eq!(found[0].results, Some(vec![]));
        let (found, _) = json(
            r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"uid":"u"},
                "status":{"allocation":null}}"#,
        );
        assert_eq!(found[0].results, None);
    }

    #[test]
    fn typed_lists_lend_their_items_kind_and_version() {
        let (found, errors) = json(
            r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaimList","metadata":{},
                "items":[{"metadata":{"uid":"a"}},{"metadata":{"uid":"b"}}]}"#,
        );
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(found.iter().map(|f| f.claim.uid.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn other_kinds_are_skipped_and_wrong_versions_reported() {
        let (found, errors) = json(
            r#"{"apiVersion":"v1","kind":"List","items":[
                {"apiVersion":"v1","kind":"Pod","metadata":{"uid":"p"},"status":{"phase":"Running"}},
                {"apiVersion":"v1","kind":"Status","status":"Failure"},
                {"apiVersion":"resource.k8s.io/v1alpha3","kind":"ResourceClaim",
                 "metadata":{"uid":"old","namespace":"n","name":"c"}},
                {"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"no-uid"}}
            ]}"#,
        );
        assert!(found.is_empty());
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains("n/c has apiVersion \"resource.k8s.io/v1alpha3\""), "{}", errors[0]);
        assert!(errors[1].contains("missing field `uid`"), "{}", errors[1]);
    }

    #[test]
    fn a_bad_yaml_document_keeps_the_ones_before() {
        let text = "apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {uid: a}\n---\n---\n\
                    apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {uid: [1]}\n---\n\
                    - not an object\n---\na: [\n";
        let (found, errors) = parse(text, Format::Yaml);
        assert_eq!(found.len(), 1);
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[2].starts_with("document 5: "), "{errors:?}");
    }
}
