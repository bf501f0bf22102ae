//! Device metadata files (KEP-5304): what each container got, in a file it can read.
//!
//! The layout is the one Kubernetes 1.37 ships (`k8s.io/dynamic-resource-allocation` v0.37.2,
//! `kubeletplugin/metadata.go` and `api/metadata`; facts in docs/facts/k8s-dra-api.md §10):
//! - on the host, one file per claim and request:
//!   `<plugin dir>/dra-device-metadata/<namespace>_<claim>/<request>/metadata.json`;
//! - in the container, bind-mounted read-only by the claim's CDI spec at
//!   `/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-metadata.json`,
//!   or under `resourceclaimtemplates/<pod claim name>/` for a claim made from a template (its
//!   generated name is not known when the pod is written);
//! - the file is a stream of the same `DeviceMetadata` object once per API version, newest first
//!   (`metadata.resource.k8s.io/v1beta1`, then `v1alpha1` for 1.36-era readers), each followed by a
//!   newline; a reader takes the first version it knows.
//!
//! Each device carries the attributes migdra publishes for it in the ResourceSlice, in the slice's
//! form (`{"string": …}`, `{"int": …}`), plus the MIG UUID once the instance exists.

use super::writer::on_disk;
use super::{CdiError, Result, SpecState};
use crate::files;
use crate::mig::devices::AttributeValue;
use crate::names::{is_dns_label, is_dns_subdomain};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// The directory under the plugin directory that holds every claim's files (the helper's
/// `metadataSubDir`).
pub const SUBDIR: &str = "dra-device-metadata";
/// Where containers find the files (`metadata.ContainerDir`).
pub const CONTAINER_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";
/// The API group of the file's objects.
pub const API_GROUP: &str = "metadata.resource.k8s.io";
/// The versions written, newest first: the 1.37 helper requires v1beta1 and allows v1alpha1,
/// the only version the 1.36 consumer library reads.
pub const API_VERSIONS: [&str; 2] = ["v1beta1", "v1alpha1"];
/// The object's kind.
pub const KIND: &str = "DeviceMetadata";
/// The annotation Kubernetes' claim controller puts on a claim made from a template: the pod's name
/// for the claim (`pod.spec.resourceClaims[].name`).
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

const FILE_NAME: &str = "metadata.json";
/// Read by the container's user, whoever that is; written only by migdra.
const FILE_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

/// The claim a file describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimMeta<'a> {
    pub uid: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    /// For a claim made from a template: the pod's name for it.
    pub pod_claim_name: Option<&'a str>,
}

/// One allocated device, as the file lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MetaDevice {
    pub pool: String,
    pub name: String,
    /// Bare keys are in the driver's domain, as in the ResourceSlice.
    pub attributes: BTreeMap<String, AttributeValue>,
}

/// One request of a claim and its devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestMeta {
    /// As in the allocation: `main`, or `main/sub` for a subrequest. The files are per `main`.
    pub request: String,
    pub devices: Vec<MetaDevice>,
}

impl RequestMeta {
    /// The request without a subrequest: the path segment.
    pub fn base(&self) -> &str {
        self.request.split('/').next().unwrap_or_default()
    }
}

/// One request's file: where it is on the host, where the container sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataMount {
    /// The base request name.
    pub request: String,
    pub host_path: PathBuf,
    pub container_path: String,
}

/// The metadata files of one driver.
#[derive(Debug, Clone)]
pub struct MetadataDir {
    /// `<plugin dir>/dra-device-metadata`.
    dir: PathBuf,
    driver: String,
}

impl MetadataDir {
    /// Files of `driver` under `dir`. Nothing is checked or created yet.
    pub fn new(dir: &Path, driver: &str) -> Self {
        Self { dir: dir.to_path_buf(), driver: driver.to_string() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `<dir>/<namespace>_<name>`: a namespace has no `_`, so the name splits back.
    ///
    /// # Errors
    /// [`CdiError::BadMetadataName`] for a namespace that is not a DNS label or a name that is not
    /// a DNS subdomain, so no path leaves the directory.
    pub fn claim_dir(&self, namespace: &str, name: &str) -> Result<PathBuf> {
        check("namespace", namespace, is_dns_label(namespace), "a DNS label")?;
        check("claim name", name, is_dns_subdomain(name), "a DNS subdomain")?;
        Ok(self.dir.join(format!("{namespace}_{name}")))
    }

    /// The files a claim's requests need, with their mounts; writes nothing.
    ///
    /// # Errors
    /// As [`MetadataDir::claim_dir`]; a request or pod claim name that is not a DNS label.
    pub fn mounts(&self, claim: &ClaimMeta<'_>, requests: &[RequestMeta]) -> Result<Vec<MetadataMount>> {
        let dir = self.claim_dir(claim.namespace, claim.name)?;
        if let Some(p) = claim.pod_claim_name {
            check("pod claim name", p, is_dns_label(p), "a DNS label")?;
        }
        let mut out = Vec::with_capacity(requests.len());
        for r in requests {
            let base = r.base();
            check("request", base, is_dns_label(base), "a DNS label")?;
            out.push(MetadataMount {
                request: base.to_string(),
                host_path: dir.join(base).join(FILE_NAME),
                container_path: container_path(&self.driver, claim, base),
            });
        }
        Ok(out)
    }

    /// Make each request's file hold exactly what [`render`] gives, writing only those missing or
    /// different; returns the mounts and the worst state found (`missing` before `altered`).
    ///
    /// # Errors
    /// As [`MetadataDir::mounts`]; [`CdiError::Io`] naming the path that cannot be written.
    pub fn ensure(&self, claim: &ClaimMeta<'_>, requests: &[RequestMeta]) -> Result<(Vec<MetadataMount>, SpecState)> {
        let mounts = self.mounts(claim, requests)?;
        let mut worst = SpecState::Intact;
        for (m, r) in mounts.iter().zip(requests) {
            let bytes = render(&self.driver, claim, r);
            let state = on_disk(&m.host_path, &bytes)?;
            if state == SpecState::Intact {
                continue;
            }
            if worst == SpecState::Intact || state == SpecState::Missing {
                worst = state;
            }
            let dir = m.host_path.parent().unwrap_or(&self.dir);
            files::create_dir(dir, DIR_MODE).map_err(|source| CdiError::Io {
                path: dir.to_path_buf(),
                op: "create directory",
                source,
            })?;
            // Not synced, like the CDI spec: the checkpoint record rebuilds it.
            files::write_atomic(&m.host_path, &bytes, FILE_MODE, files::Durability::Atomic)
                .map_err(|e| CdiError::Io { path: e.path, op: e.step.op(), source: e.source })?;
        }
        Ok((mounts, worst))
    }

    /// What the claim's files are on disk, compared with [`render`]'s. Reads only.
    ///
    /// # Errors
    /// As [`MetadataDir::mounts`].
    pub fn check(&self, claim: &ClaimMeta<'_>, requests: &[RequestMeta]) -> Result<SpecState> {
        let mut worst = SpecState::Intact;
        for (m, r) in self.mounts(claim, requests)?.iter().zip(requests) {
            match on_disk(&m.host_path, &render(&self.driver, claim, r))? {
                SpecState::Intact => {}
                SpecState::Missing => return Ok(SpecState::Missing),
                SpecState::Altered => worst = SpecState::Altered,
            }
        }
        Ok(worst)
    }

    /// Remove a claim's files. Missing ones are success, so unprepare can repeat.
    ///
    /// # Errors
    /// A bad name; [`CdiError::Io`].
    pub fn remove(&self, namespace: &str, name: &str) -> Result<()> {
        let dir = self.claim_dir(namespace, name)?;
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            // Under a file where the directory should be, the claim's files cannot exist.
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(()),
            Err(source) => Err(CdiError::Io { path: dir, op: "remove", source }),
        }
    }

    /// The (namespace, name) of every claim that has files here, sorted. Entries that are not a
    /// claim's directory are not ours and are left out. A missing directory holds none.
    ///
    /// # Errors
    /// [`CdiError::Io`] when the directory cannot be listed.
    pub fn claims(&self) -> Result<Vec<(String, String)>> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(CdiError::Io { path: self.dir.clone(), op: "list", source }),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some((ns, claim)) = name.to_str().and_then(|n| n.split_once('_')) else { continue };
            if is_dns_label(ns) && is_dns_subdomain(claim) && entry.path().is_dir() {
                out.push((ns.to_string(), claim.to_string()));
            }
        }
        out.sort();
        Ok(out)
    }
}

fn check(field: &'static str, value: &str, ok: bool, expected: &'static str) -> Result<()> {
    if ok { Ok(()) } else { Err(CdiError::BadMetadataName { field, value: value.to_string(), expected }) }
}

/// Where the container reads a request's file (`metadata.ResourceClaimFilePath`,
/// `ResourceClaimTemplateFilePath`).
pub fn container_path(driver: &str, claim: &ClaimMeta<'_>, request: &str) -> String {
    let base = request.split('/').next().unwrap_or_default();
    match claim.pod_claim_name.filter(|p| !p.is_empty()) {
        Some(p) => format!("{CONTAINER_DIR}/resourceclaimtemplates/{p}/{base}/{driver}-metadata.json"),
        None => format!("{CONTAINER_DIR}/resourceclaims/{}/{base}/{driver}-metadata.json", claim.name),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Doc<'a> {
    kind: &'static str,
    api_version: String,
    metadata: Meta<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_claim_name: Option<&'a str>,
    requests: [Request<'a>; 1],
}

#[derive(Serialize)]
struct Meta<'a> {
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
    /// 1: written once at prepare, never updated (the helper counts updates from NRI hooks).
    generation: i64,
}

#[derive(Serialize)]
struct Request<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    devices: Vec<Device<'a>>,
}

#[derive(Serialize)]
struct Device<'a> {
    driver: &'a str,
    pool: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    attributes: &'a BTreeMap<String, AttributeValue>,
}

/// The bytes of one request's file: the object in each of [`API_VERSIONS`], newest first, each
/// indented and followed by a newline, field for field what the 1.37 helper writes.
pub fn render(driver: &str, claim: &ClaimMeta<'_>, request: &RequestMeta) -> Vec<u8> {
    let devices: Vec<Device<'_>> = request
        .devices
        .iter()
        .map(|d| Device { driver, pool: &d.pool, name: &d.name, attributes: &d.attributes })
        .collect();
    let mut doc = Doc {
        kind: KIND,
        api_version: String::new(),
        metadata: Meta { name: claim.name, namespace: claim.namespace, uid: claim.uid, generation: 1 },
        pod_claim_name: claim.pod_claim_name.filter(|p| !p.is_empty()),
        requests: [Request { name: &request.request, devices }],
    };
    let mut out = Vec::new();
    for version in API_VERSIONS {
        doc.api_version = format!("{API_GROUP}/{version}");
        // Strings, integers and maps of them: serializing cannot fail.
        out.extend(serde_json::to_vec_pretty(&doc).unwrap_or_default());
        out.push(b'\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const DRIVER: &str = "mig.slinky.slurm.net";

    fn claim(pod_claim_name: Option<&str>) -> ClaimMeta<'_> {
        ClaimMeta { uid: "u-1", namespace: "team-a", name: "nb-gpu-x7k2p", pod_claim_name }
    }

    fn request(name: &str) -> RequestMeta {
        RequestMeta {
            request: name.into(),
            devices: vec![MetaDevice {
                pool: "node-a".into(),
                name: "gpu-0-mig-3g40gb-9-4".into(),
                attributes: BTreeMap::from([
                    ("uuid".into(), AttributeValue::String("MIG-1".into())),
                    ("placementStart".into(), AttributeValue::Int(4)),
                    ("driverVersion".into(), AttributeValue::Version("580.95.5".into())),
                ]),
            }],
        }
    }

    fn objects(bytes: &[u8]) -> Vec<Value> {
        serde_json::Deserializer::from_slice(bytes).into_iter::<Value>().map(Result::unwrap).collect()
    }

    #[test]
    fn the_file_is_one_object_per_version_newest_first() {
        let bytes = render(DRIVER, &claim(Some("gpu")), &request("main/small"));
        assert!(bytes.ends_with(b"}\n"));
        let objs = objects(&bytes);
        let versions: Vec<&str> = objs.iter().map(|o| o["apiVersion"].as_str().unwrap()).collect();
        assert_eq!(versions, ["metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1"]);
        assert_eq!(objs[0]["kind"], "DeviceMetadata");
        assert_eq!(
            objs[0]["metadata"],
            json!({"name": "nb-gpu-x7k2p", "namespace": "team-a", "uid": "u-1", "generation": 1})
        );
        assert_eq!(objs[0]["podClaimName"], "gpu");
        assert_eq!(objs[0]["requests"][0]["name"], "main/small", "the subrequest stays in the content");
        assert_eq!(
            objs[0]["requests"][0]["devices"][0],
            json!({"driver": DRIVER, "pool": "node-a", "name": "gpu-0-mig-3g40gb-9-4", "attributes": {
                "driverVersion": {"version": "580.95.5"}, "placementStart": {"int": 4}, "uuid": {"string": "MIG-1"}}})
        );
        let mut alpha = objs[1].clone();
        alpha["apiVersion"] = objs[0]["apiVersion"].clone();
        assert_eq!(alpha, objs[0], "the versions differ only in apiVersion");
        let direct = objects(&render(DRIVER, &claim(None), &request("main")));
        assert!(direct[0].get("podClaimName").is_none());
    }

    #[test]
    fn paths_follow_the_kep_layout() {
        let tmp = tempfile::tempdir().unwrap();
        let md = MetadataDir::new(&tmp.path().join(SUBDIR), DRIVER);
        let m = md.mounts(&claim(None), &[request("main/small")]).unwrap();
        assert_eq!(m[0].host_path, tmp.path().join("dra-device-metadata/team-a_nb-gpu-x7k2p/main/metadata.json"));
        assert_eq!(
            m[0].container_path,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/nb-gpu-x7k2p/main/\
             mig.slinky.slurm.net-metadata.json"
        );
        let t = md.mounts(&claim(Some("gpu")), &[request("main")]).unwrap();
        assert_eq!(
            t[0].container_path,
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/main/\
             mig.slinky.slurm.net-metadata.json"
        );
    }

    #[test]
    fn names_that_would_leave_the_directory_are_refused() {
        let md = MetadataDir::new(Path::new("/m"), DRIVER);
        let bad = |c: ClaimMeta<'_>, r: &str| md.mounts(&c, &[request(r)]).unwrap_err().to_string();
        let ok = claim(None);
        assert!(bad(ClaimMeta { namespace: "..", ..ok }, "main").contains("namespace \"..\""));
        assert!(bad(ClaimMeta { namespace: "a_b", ..ok }, "main").contains("namespace"));
        assert!(bad(ClaimMeta { name: "../x", ..ok }, "main").contains("claim name"));
        assert!(bad(ok, "..").contains("request \"..\""));
        assert!(bad(ClaimMeta { pod_claim_name: Some("a/b"), ..ok }, "main").contains("pod claim name"));
    }

    #[test]
    fn ensure_writes_what_differs_and_remove_takes_the_claim_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let md = MetadataDir::new(&tmp.path().join(SUBDIR), DRIVER);
        let (c, r) = (claim(None), [request("main"), request("other")]);
        assert_eq!(md.check(&c, &r).unwrap(), SpecState::Missing);
        let (mounts, state) = md.ensure(&c, &r).unwrap();
        assert_eq!((mounts.len(), state), (2, SpecState::Missing));
        assert_eq!(fs::read(&mounts[0].host_path).unwrap(), render(DRIVER, &c, &r[0]));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&mounts[0].host_path).unwrap().permissions().mode() & 0o777, 0o644);
        assert_eq!(md.ensure(&c, &r).unwrap().1, SpecState::Intact);
        fs::write(&mounts[1].host_path, "{}").unwrap();
        assert_eq!(md.check(&c, &r).unwrap(), SpecState::Altered);
        assert_eq!(md.ensure(&c, &r).unwrap().1, SpecState::Altered);
        assert_eq!(md.check(&c, &r).unwrap(), SpecState::Intact);
        assert_eq!(md.claims().unwrap(), [("team-a".to_string(), "nb-gpu-x7k2p".to_string())]);
        md.remove("team-a", "nb-gpu-x7k2p").unwrap();
        md.remove("team-a", "nb-gpu-x7k2p").unwrap();
        assert!(md.claims().unwrap().is_empty());
    }

    #[test]
    fn an_unwritable_directory_is_one_error_naming_the_path() {
        let tmp = tempfile::tempdir().unwrap();
        let blocked = tmp.path().join(SUBDIR);
        fs::write(&blocked, "a file where the directory should be").unwrap();
        let md = MetadataDir::new(&blocked, DRIVER);
        let err = md.ensure(&claim(None), &[request("main")]).unwrap_err().to_string();
        assert!(err.contains(&blocked.join("team-a_nb-gpu-x7k2p/main").display().to_string()), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
}
