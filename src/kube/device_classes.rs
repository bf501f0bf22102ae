//! The DeviceClasses that name migdra's devices: `mig` (any partition), `gpu` (a whole GPU) and
//! one per MIG profile. Pure: built from profile names, written by `migdra device-classes`.
//!
//! Each class has exactly one CEL selector, because slurm-bridge accepts a class only then and
//! matches it to its device profiles by that selector, byte for byte
//! (docs/facts/slurm-bridge.md §7). The per-profile and whole-GPU classes carry the extended
//! resource name NVIDIA's device plugin gives the same thing in its mixed strategy
//! (`nvidia.com/mig-1g.10gb`, `nvidia.com/gpu`; a `+` in a profile becomes `.`), so that with
//! KEP-5004 a pod written for the device plugin gets a migdra device unchanged, and slurm-bridge,
//! which admits only extended-resource requests, can bridge it.

use k8s_openapi::api::resource::v1::{CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use thiserror::Error;

/// How class names and extended resource names are made from a profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    /// Before the profile in a class name: `mig-` gives `mig-1g.10gb`.
    pub class_prefix: String,
    /// Before the profile in an extended resource name: `nvidia.com/mig-` gives
    /// `nvidia.com/mig-1g.10gb`; empty: the profile classes have none.
    pub resource_prefix: String,
    /// The whole-GPU class's extended resource name; `None`: it has none.
    pub gpu_resource: Option<String>,
}

impl Default for Naming {
    fn default() -> Self {
        Self {
            class_prefix: "mig-".into(),
            resource_prefix: "nvidia.com/mig-".into(),
            gpu_resource: Some("nvidia.com/gpu".into()),
        }
    }
}

/// What a class selects.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Selects {
    /// Every MIG partition or instance.
    AnyMig,
    /// A whole GPU.
    WholeGpu,
    /// Partitions and instances of one profile, e.g. `1g.10gb+me`.
    Profile(String),
}

/// One DeviceClass, before it becomes an API object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Class {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extended_resource_name: Option<String>,
    pub selector: String,
    pub selects: Selects,
}

/// A class that the API server would refuse, or two profiles that would share one.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClassError {
    #[error(
        "DeviceClass name {name:?} (for {what}) is not a DNS subdomain: lower-case letters, \
         digits, '-' and '.', at most 253 characters"
    )]
    ClassName { name: String, what: String },
    #[error("extended resource name {name:?} (for {what}) is not valid: {problem}")]
    ResourceName { name: String, what: String, problem: String },
    #[error("profiles {a:?} and {b:?} would both be DeviceClass or extended resource {name:?}")]
    Collision { a: String, b: String, name: String },
}

/// A profile as the device plugin writes it in resource names: `+` becomes `.`.
pub fn resource_slug(profile: &str) -> String {
    profile.replace('+', ".")
}

/// The classes for these profiles: `mig`, `gpu`, then one per profile in the order given.
///
/// # Errors
/// A name the API server would refuse, or two profiles that map to one name.
pub fn classes(driver: &str, profiles: &[String], naming: &Naming) -> Result<Vec<Class>, ClassError> {
    let base = format!("device.driver == \"{driver}\"");
    let attr = |name: &str| format!("device.attributes[\"{driver}\"].{name}");
    let mut out = vec![
        Class {
            name: "mig".into(),
            extended_resource_name: None,
            selector: format!("{base} && {} == \"mig\"", attr("type")),
            selects: Selects::AnyMig,
        },
        Class {
            name: "gpu".into(),
            extended_resource_name: naming.gpu_resource.clone(),
            selector: format!("{base} && {} == \"gpu\"", attr("type")),
            selects: Selects::WholeGpu,
        },
    ];
    for p in profiles {
        let slug = resource_slug(p);
        let resource = (!naming.resource_prefix.is_empty()).then(|| format!("{}{slug}", naming.resource_prefix));
        out.push(Class {
            name: format!("{}{slug}", naming.class_prefix),
            extended_resource_name: resource,
            // `type` first: a whole GPU has no `profile`, and `false && <missing key>` is false.
            selector: format!("{base} && {} == \"mig\" && {} == \"{p}\"", attr("type"), attr("profile")),
            selects: Selects::Profile(p.clone()),
        });
    }
    check(&out)?;
    Ok(out)
}

fn what(c: &Class) -> String {
    match &c.selects {
        Selects::AnyMig => "any MIG device".into(),
        Selects::WholeGpu => "whole GPUs".into(),
        Selects::Profile(p) => format!("profile {p}"),
    }
}

fn check(classes: &[Class]) -> Result<(), ClassError> {
    let mut seen: Vec<(&str, String)> = Vec::new();
    for c in classes {
        if !crate::names::is_dns_subdomain(&c.name) {
            return Err(ClassError::ClassName { name: c.name.clone(), what: what(c) });
        }
        let mut names = vec![c.name.as_str()];
        if let Some(r) = &c.extended_resource_name {
            if let Some(problem) = crate::names::extended_resource_name_problem(r) {
                return Err(ClassError::ResourceName { name: r.clone(), what: what(c), problem });
            }
            names.push(r);
        }
        for name in names {
            if let Some((_, other)) = seen.iter().find(|(n, _)| *n == name) {
                return Err(ClassError::Collision { a: other.clone(), b: what(c), name: name.to_string() });
            }
            seen.push((name, what(c)));
        }
    }
    Ok(())
}

/// The API object.
pub fn device_class(c: &Class) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta { name: Some(c.name.clone()), ..ObjectMeta::default() },
        spec: Some(DeviceClassSpec {
            selectors: Some(vec![DeviceSelector { cel: Some(CELDeviceSelector { expression: c.selector.clone() }) }]),
            extended_resource_name: c.extended_resource_name.clone(),
            ..DeviceClassSpec::default()
        }),
    }
}

/// One entry of slurm-bridge's `deviceProfiles` configuration: the profile name is the Slurm
/// GRES type, and its selector is the class's, so the bridge accepts the class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BridgeProfile {
    pub name: String,
    pub driver: String,
    pub selector: String,
    pub backend: BridgeBackend,
}

/// slurm-bridge's `indexed-gres` backend: each device is one unit of GRES `gresName`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BridgeBackend {
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(rename = "gresName")]
    pub gres_name: &'static str,
}

/// slurm-bridge device profiles for the whole-GPU class and, with `static_mig`, each profile
/// class: one GRES unit per device is right only for devices that never overlap, so a dynamic
/// MIG node (every possible partition published) must not use the profile entries.
pub fn bridge_profiles(driver: &str, classes: &[Class], static_mig: bool) -> Vec<BridgeProfile> {
    classes
        .iter()
        .filter(|c| match c.selects {
            Selects::WholeGpu => true,
            Selects::Profile(_) => static_mig,
            Selects::AnyMig => false,
        })
        .map(|c| BridgeProfile {
            name: c.name.clone(),
            driver: driver.to_string(),
            selector: c.selector.clone(),
            backend: BridgeBackend { kind: "indexed-gres", gres_name: "gpu" },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "mig.slinky.slurm.net";

    fn names(ps: &[&str]) -> Vec<String> {
        ps.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn a_class_per_profile_with_the_device_plugins_resource_name() {
        let cs =
            classes(D, &names(&["1g.10gb", "1g.10gb+me", "1g.24gb+me.all", "1g.24gb-me"]), &Naming::default()).unwrap();
        let got: Vec<(&str, Option<&str>)> =
            cs.iter().map(|c| (c.name.as_str(), c.extended_resource_name.as_deref())).collect();
        assert_eq!(
            got,
            [
                ("mig", None),
                ("gpu", Some("nvidia.com/gpu")),
                ("mig-1g.10gb", Some("nvidia.com/mig-1g.10gb")),
                ("mig-1g.10gb.me", Some("nvidia.com/mig-1g.10gb.me")),
                ("mig-1g.24gb.me.all", Some("nvidia.com/mig-1g.24gb.me.all")),
                ("mig-1g.24gb-me", Some("nvidia.com/mig-1g.24gb-me")),
            ]
        );
        assert_eq!(
            cs[3].selector,
            concat!(
                r#"device.driver == "mig.slinky.slurm.net" && "#,
                r#"device.attributes["mig.slinky.slurm.net"].type == "mig" && "#,
                r#"device.attributes["mig.slinky.slurm.net"].profile == "1g.10gb+me""#
            )
        );
        let dc = device_class(&cs[2]);
        let spec = dc.spec.expect("a spec");
        assert_eq!(spec.selectors.as_ref().map(Vec::len), Some(1), "exactly one selector");
        assert_eq!(spec.extended_resource_name.as_deref(), Some("nvidia.com/mig-1g.10gb"));
    }

    #[test]
    fn every_catalog_profile_gets_a_valid_distinct_class() {
        let mut all: Vec<String> = Vec::new();
        for m in crate::mig::catalog::models() {
            for p in &m.profiles {
                if !all.contains(&p.name) {
                    all.push(p.name.clone());
                }
            }
        }
        let cs = classes(D, &all, &Naming::default()).unwrap();
        assert_eq!(cs.len(), all.len() + 2);
    }

    #[test]
    fn names_the_api_server_would_refuse_are_one_line_errors() {
        let bad_prefix = Naming { class_prefix: "MIG_".into(), ..Naming::default() };
        let e = classes(D, &names(&["1g.10gb"]), &bad_prefix).unwrap_err().to_string();
        assert!(e.contains("\"MIG_1g.10gb\"") && e.contains("profile 1g.10gb"), "{e}");
        let bad_resource = Naming { resource_prefix: "mig-".into(), ..Naming::default() };
        let e = classes(D, &names(&["1g.10gb"]), &bad_resource).unwrap_err().to_string();
        assert!(e.contains("\"mig-1g.10gb\"") && e.contains("no domain"), "{e}");
        let bad_gpu = Naming { gpu_resource: Some("kubernetes.io/gpu".into()), ..Naming::default() };
        assert!(classes(D, &[], &bad_gpu).unwrap_err().to_string().contains("whole GPUs"));
        let e = classes(D, &names(&["1g.10gb+me", "1g.10gb.me"]), &Naming::default()).unwrap_err().to_string();
        assert!(e.contains("1g.10gb+me") && e.contains("1g.10gb.me") && e.contains("mig-1g.10gb.me"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn no_resource_prefix_means_no_extended_resource_on_profile_classes() {
        let n = Naming { resource_prefix: String::new(), gpu_resource: None, ..Naming::default() };
        let cs = classes(D, &names(&["3g.40gb"]), &n).unwrap();
        assert!(cs.iter().all(|c| c.extended_resource_name.is_none()));
    }

    #[test]
    fn bridge_profiles_share_the_class_selector_byte_for_byte() {
        let cs = classes(D, &names(&["1g.10gb", "3g.40gb"]), &Naming::default()).unwrap();
        let dynamic = bridge_profiles(D, &cs, false);
        assert_eq!(dynamic.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["gpu"]);
        let static_mig = bridge_profiles(D, &cs, true);
        assert_eq!(static_mig.len(), 3);
        for p in &static_mig {
            let class = cs.iter().find(|c| c.name == p.name).unwrap();
            assert_eq!(p.selector.as_bytes(), class.selector.as_bytes());
            assert_eq!((p.backend.kind, p.backend.gres_name), ("indexed-gres", "gpu"));
        }
    }
}
