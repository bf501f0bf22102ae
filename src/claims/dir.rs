//! Claims from a directory of files (`--claims-dir`): ResourceClaim objects exactly as the API
//! server returns them, JSON or YAML.
//!
//! The directory is read again on every lookup, because whoever fills it (a test, an operator, a
//! sync loop) may change it at any time. Hidden files are skipped, which also skips the `..data`
//! machinery of a mounted ConfigMap while still following its symlinked files.

use super::object::{self, Format, FoundClaim};
use super::{Claim, ClaimError, ClaimRef, ClaimSource, Origin, Result};
use std::fs;
use std::path::{Path, PathBuf};

/// A [`ClaimSource`] over the `*.json`, `*.yaml` and `*.yml` files of one directory, matched by
/// `metadata.uid`.
#[derive(Debug, Clone)]
pub struct DirSource {
    dir: PathBuf,
}

/// Everything a directory holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Every ResourceClaim, with the file it came from, in file order.
    pub claims: Vec<(PathBuf, FoundClaim)>,
    /// Files (or objects in them) that could not be read, with the reason.
    pub errors: Vec<(PathBuf, String)>,
}

impl DirSource {
    pub fn new(dir: &Path) -> Self {
        Self { dir: dir.to_path_buf() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Read every claim file of the directory, in name order.
    ///
    /// # Errors
    /// [`ClaimError::Io`] when the directory cannot be listed; problems with single files are in
    /// [`Scan::errors`].
    pub fn scan(&self) -> Result<Scan> {
        let io = |source| ClaimError::Io { path: self.dir.clone(), op: "list claims directory", source };
        let mut files = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
            if name.starts_with('.') {
                continue;
            }
            let format = match path.extension().and_then(|e| e.to_str()) {
                Some("json") => Format::Json,
                Some("yaml" | "yml") => Format::Yaml,
                _ => continue,
            };
            // Follows symlinks: a ConfigMap volume's files are links into `..data/`.
            if fs::metadata(&path).is_ok_and(|m| m.is_file()) {
                files.push((path, format));
            }
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        let mut scan = Scan::default();
        for (path, format) in files {
            let text = match fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) => {
                    scan.errors.push((path, format!("failed to read: {e}")));
                    continue;
                }
            };
            let (found, errors) = object::parse(&text, format);
            scan.claims.extend(found.into_iter().map(|c| (path.clone(), c)));
            scan.errors.extend(errors.into_iter().map(|e| (path.clone(), e)));
        }
        Ok(scan)
    }
}

impl ClaimSource for DirSource {
    /// The claim with the reference's UID. An unparsable file does not hide a claim found in
    /// another file; only when no file holds the UID are the parse errors returned
    /// ([`ClaimError::NotFound`]), since the claim may be in one of them.
    fn get(&self, claim: &ClaimRef) -> Result<Option<Claim>> {
        claim.validate()?;
        let scan = self.scan()?;
        let mut matches = scan.claims.into_iter().filter(|(_, f)| f.claim.uid == claim.uid);
        let Some((file, found)) = matches.next() else {
            if scan.errors.is_empty() {
                return Ok(None);
            }
            return Err(ClaimError::NotFound { uid: claim.uid.clone(), dir: self.dir.clone(), errors: scan.errors });
        };
        let others: Vec<PathBuf> = matches.filter(|(_, f)| *f != found).map(|(p, _)| p).collect();
        if !others.is_empty() {
            let files = std::iter::once(file).chain(others).collect();
            return Err(ClaimError::Ambiguous { uid: claim.uid.clone(), files });
        }
        if !claim.matches(&found.claim) {
            return Err(ClaimError::Mismatch {
                expected: claim.clone(),
                found: Box::new(found.claim),
                origin: Origin::File(file),
            });
        }
        match found.results {
            Some(results) => Ok(Some(Claim { claim: found.claim, results, pod_claim_name: found.pod_claim_name })),
            None => Err(ClaimError::NotAllocated { claim: found.claim, origin: Origin::File(file) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::AllocationResult;

    /// `kubectl get resourceclaim -n ml trainer-gpu-x7k2p -o json`, and the same with `-o yaml`.
    const CLAIM_JSON: &str = include_str!("testdata/resourceclaim.json");
    const CLAIM_YAML: &str = include_str!("testdata/resourceclaim.yaml");
    const UID: &str = "5f0c3b1e-8a0d-4c9e-9a55-2b7f0e4d6c11";

    fn claim_ref() -> ClaimRef {
        ClaimRef::new(UID, "ml", "trainer-gpu-x7k2p")
    }

    fn expected() -> Claim {
        let result = |request: &str, driver: &str, pool: &str, device: &str, admin_access| AllocationResult {
            request: request.into(),
            driver: driver.into(),
            pool: pool.into(),
            device: device.into(),
            admin_access,
        };
        Claim {
            claim: claim_ref(),
            results: vec![
                result("gpu", "mig.slinky.slurm.net", "node-a", "gpu-0-mig-3g40gb-9-4", None),
                result("nic", "net.example.com", "node-a-nics", "eth-2", None),
                result("monitor", "mig.slinky.slurm.net", "node-a", "gpu-1", Some(true)),
            ],
            pod_claim_name: Some("gpu".into()),
        }
    }

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        for (name, text) in files {
            fs::write(tmp.path().join(name), text).unwrap();
        }
        tmp
    }

    fn get(tmp: &tempfile::TempDir, r: &ClaimRef) -> Result<Option<Claim>> {
        DirSource::new(tmp.path()).get(r)
    }

    fn unallocated(uid: &str, name: &str) -> String {
        format!(
            r#"{{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
                "metadata":{{"uid":"{uid}","namespace":"ml","name":"{name}"}},"spec":{{}}}}"#
        )
    }

    #[test]
    fn kubectl_json_and_yaml_give_the_same_claim() {
        for (file, text) in [("c.json", CLAIM_JSON), ("c.yaml", CLAIM_YAML), ("c.yml", CLAIM_YAML)] {
            let tmp = dir_with(&[(file, text)]);
            assert_eq!(get(&tmp, &claim_ref()).unwrap(), Some(expected()), "{file}");
            assert_eq!(get(&tmp, &ClaimRef::new(UID, "", "")).unwrap(), Some(expected()), "{file}");
        }
        let claim = expected();
        let ours: Vec<&str> = claim.results_for("mig.slinky.slurm.net").map(|r| r.device.as_str()).collect();
        assert_eq!(ours, ["gpu-0-mig-3g40gb-9-4", "gpu-1"]);
    }

    #[test]
    fn a_multi_document_yaml_file_holds_several_claims() {
        let other = unallocated("0e9d8c7b-0000-4000-8000-000000000001", "other");
        let text = format!("{other}\n---\n{CLAIM_YAML}\n---\n");
        let tmp = dir_with(&[("all.yaml", &text)]);
        assert_eq!(get(&tmp, &claim_ref()).unwrap(), Some(expected()));
        let scan = DirSource::new(tmp.path()).scan().unwrap();
        assert_eq!(scan.claims.len(), 2);
        assert!(scan.errors.is_empty(), "{:?}", scan.errors);
    }

    #[test]
    fn a_list_holds_several_claims() {
        let other = unallocated("0e9d8c7b-0000-4000-8000-000000000001", "other");
        let list = format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{"resourceVersion":""}},"items":[{other},{CLAIM_JSON}]}}"#
        );
        let tmp = dir_with(&[("list.json", &list)]);
        assert_eq!(get(&tmp, &claim_ref()).unwrap(), Some(expected()));
        let yaml_list = format!(
            "apiVersion: v1\nkind: List\nitems:\n- {}\n",
            serde_norway::from_str::<serde_json::Value>(CLAIM_YAML).map(|v| v.to_string()).unwrap()
        );
        let tmp = dir_with(&[("list.yaml", &yaml_list)]);
        assert_eq!(get(&tmp, &claim_ref()).unwrap(), Some(expected()));
    }

    #[test]
    fn a_claim_without_allocation_is_an_error() {
        let tmp = dir_with(&[("c.json", &unallocated(UID, "trainer-gpu-x7k2p"))]);
        let err = get(&tmp, &claim_ref()).unwrap_err();
        assert!(matches!(err, ClaimError::NotAllocated { .. }), "{err}");
        assert!(err.to_string().contains("ml/trainer-gpu-x7k2p"), "{err}");
    }

    #[test]
    fn an_unknown_uid_is_none() {
        let tmp = dir_with(&[("c.json", CLAIM_JSON), ("notes.txt", "not a claim")]);
        assert_eq!(get(&tmp, &ClaimRef::new("0e9d8c7b-0000-4000-8000-00000000ffff", "ml", "x")).unwrap(), None);
        let empty = dir_with(&[]);
        assert_eq!(get(&empty, &claim_ref()).unwrap(), None);
    }

    #[test]
    fn a_garbage_file_does_not_hide_a_match_but_explains_a_miss() {
        let tmp = dir_with(&[("a-broken.json", "{\"apiVersion\": "), ("b.yaml", CLAIM_YAML), ("c.yaml", "a: [")]);
        assert_eq!(get(&tmp, &claim_ref()).unwrap(), Some(expected()));
        let err = get(&tmp, &ClaimRef::new("0e9d8c7b-0000-4000-8000-00000000ffff", "", "")).unwrap_err();
        let ClaimError::NotFound { errors, .. } = &err else { panic!("{err}") };
        let files: Vec<String> = errors.iter().map(|(p, _)| p.file_name().unwrap().to_string_lossy().into()).collect();
        assert_eq!(files, ["a-broken.json", "c.yaml"]);
        assert!(!err.to_string().contains('\n'), "{err}");
    }

    #[test]
    fn hidden_files_and_other_extensions_are_ignored() {
        let tmp = dir_with(&[(".c.json", CLAIM_JSON), ("c.json.bak", CLAIM_JSON), (".swp.yaml", "a: [")]);
        fs::create_dir(tmp.path().join("sub.json")).unwrap();
        assert_eq!(get(&tmp, &claim_ref()).unwrap(), None);
    }

    #[test]
    fn a_mounted_configmap_is_read_through_its_symlinks() {
        let tmp = dir_with(&[]);
        let data = tmp.path().join("..2026_03_02_10_14_07.1");
        fs::create_dir(&data).unwrap();
        fs::write(data.join("claim.yaml"), CLAIM_YAML).unwrap();
        std::os::unix::fs::symlink(&data, tmp.path().join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/claim.yaml", tmp.path().join("claim.yaml")).unwrap();
        let scan = DirSource::new(tmp.path()).scan().unwrap();
        assert_eq!(scan.claims.len(), 1, "{scan:?}");
        assert_eq!(get(&tmp, &claim_ref()).unwrap(), Some(expected()));
    }

    #[test]
    fn a_uid_of_another_claim_is_refused() {
        let tmp = dir_with(&[("c.json", CLAIM_JSON)]);
        for r in [ClaimRef::new(UID, "other", "trainer-gpu-x7k2p"), ClaimRef::new(UID, "ml", "other")] {
            let err = get(&tmp, &r).unwrap_err();
            assert!(matches!(err, ClaimError::Mismatch { .. }), "{err}");
            assert!(err.to_string().contains("ml/trainer-gpu-x7k2p"), "{err}");
        }
    }

    #[test]
    fn bad_refs_are_refused_before_reading() {
        let absent = DirSource::new(Path::new("/nonexistent/claims"));
        for r in [ClaimRef::new("../x", "", ""), ClaimRef::new(UID, "Bad_NS", ""), ClaimRef::new(UID, "ml", "a/b")] {
            assert!(matches!(absent.get(&r), Err(ClaimError::BadRef { .. })), "{r:?}");
        }
        assert!(matches!(absent.get(&claim_ref()), Err(ClaimError::Io { .. })));
    }

    #[test]
    fn the_same_claim_twice_is_fine_but_two_different_ones_are_ambiguous() {
        let tmp = dir_with(&[("a.json", CLAIM_JSON), ("b.yaml", CLAIM_YAML)]);
        assert_eq!(get(&tmp, &claim_ref()).unwrap(), Some(expected()));
        let tmp = dir_with(&[("a.json", CLAIM_JSON), ("b.json", &unallocated(UID, "trainer-gpu-x7k2p"))]);
        let err = get(&tmp, &claim_ref()).unwrap_err();
        assert!(matches!(err, ClaimError::Ambiguous { ref files, .. } if files.len() == 2), "{err}");
    }

    #[test]
    fn the_directory_is_read_again_on_every_call() {
        let tmp = dir_with(&[]);
        let source = DirSource::new(tmp.path());
        assert_eq!(source.get(&claim_ref()).unwrap(), None);
        fs::write(tmp.path().join("c.json"), CLAIM_JSON).unwrap();
        assert_eq!(source.get(&claim_ref()).unwrap(), Some(expected()));
        fs::remove_file(tmp.path().join("c.json")).unwrap();
        assert_eq!(source.get(&claim_ref()).unwrap(), None);
    }
}
