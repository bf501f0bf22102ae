//! Writing, reading and removing one claim's spec file.
//!
//! Runtimes watch the CDI directory and may read a spec at any moment, so a spec appears whole or
//! not at all: it is written to a hidden temp file (a name no runtime loads: not `*.json`/`*.yaml`)
//! in the same directory and renamed over the final name.
//!
//! Neither the write nor a removal is fsynced ([`files::Durability::Atomic`]): a spec is a copy of
//! what the claim's checkpoint record says, and that record is durable. A crashed process leaves
//! the page cache, so the spec is there for the next one; only a power loss can lose or empty it,
//! and after the reboot the claim is marked for re-creation and its next prepare writes the spec
//! again. Within a boot, a prepared claim's spec that is missing or changed is written again from
//! the record (recovery, a repeated prepare, `migdra cleanup`), and a spec whose claim the
//! checkpoint does not hold is removed at recovery, readable or not.

use super::{CDI_VERSION, CdiDevice, CdiError, Result, Spec, is_valid_vendor};
use crate::files;
use std::collections::HashSet;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// Mode of a spec file: runtimes (root) read it; anyone may read it for debugging.
const SPEC_MODE: u32 = 0o644;
/// Mode of the CDI directory when migdra has to create it.
const DIR_MODE: u32 = 0o755;

/// Files that [`CdiWriter::list`] could not read, with the reason.
pub type Unreadable = Vec<(PathBuf, String)>;

/// Writes and removes the spec files of one driver in one CDI directory.
#[derive(Debug, Clone)]
pub struct CdiWriter {
    /// The CDI directory (default `/var/run/cdi`).
    dir: PathBuf,
    /// The DRA driver name: the CDI vendor, and the prefix of every file name.
    driver: String,
}

impl CdiWriter {
    /// A writer for `<dir>/<driver>-claim_<uid>.json` files. Nothing is checked or created yet.
    pub fn new(dir: &Path, driver: &str) -> Self {
        Self { dir: dir.to_path_buf(), driver: driver.to_string() }
    }

    /// The CDI directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CDI kind of every spec: `<driver>/claim`.
    pub fn kind(&self) -> String {
        format!("{}/claim", self.driver)
    }

    /// The fully qualified CDI ID of a device: `<driver>/claim=<name>`.
    pub fn qualified_id(&self, device_name: &str) -> String {
        format!("{}={device_name}", self.kind())
    }

    fn file_prefix(&self) -> String {
        format!("{}-claim_", self.driver)
    }

    fn check_driver(&self) -> Result<()> {
        if is_valid_vendor(&self.driver) { Ok(()) } else { Err(CdiError::BadDriver { driver: self.driver.clone() }) }
    }

    /// Path of a claim's spec: `<dir>/<driver>-claim_<uid>.json`.
    ///
    /// # Errors
    /// [`CdiError::BadClaimUid`] unless the UID is `[a-z0-9-]{1,64}` (Kubernetes UIDs are RFC 4122
    /// strings), so a path built from claim data never leaves the directory;
    /// [`CdiError::BadDriver`] for a driver name that is not a CDI vendor name.
    pub fn spec_path(&self, claim_uid: &str) -> Result<PathBuf> {
        if !crate::names::is_uid(claim_uid) {
            return Err(CdiError::BadClaimUid { uid: claim_uid.to_string() });
        }
        self.check_driver()?;
        Ok(self.dir.join(format!("{}{claim_uid}.json", self.file_prefix())))
    }

    /// Write the claim's spec atomically and return the devices' fully qualified CDI IDs
    /// (`<kind>=<name>`), in order. An existing spec of the claim is replaced.
    ///
    /// # Errors
    /// Bad UID or driver; [`CdiError::NoDevices`]; [`CdiError::BadDevice`] for an invalid device or
    /// a duplicate name (checked before anything touches the disk); [`CdiError::Io`], after which no
    /// temp file is left behind and an earlier spec of the claim is unchanged.
    pub fn write(&self, claim_uid: &str, devices: &[CdiDevice]) -> Result<Vec<String>> {
        let (path, bytes, ids) = self.render(claim_uid, devices)?;
        self.store(&path, &bytes)?;
        Ok(ids)
    }

    /// Make the claim's spec on disk hold exactly `devices`: a spec deleted or changed since it was
    /// written (by hand, a tmpfs wiped, an external cleanup) is written again, an intact one is left
    /// alone. Returns the CDI IDs and what the file was before.
    ///
    /// # Errors
    /// As [`CdiWriter::write`]; a file that cannot be read counts as altered and is replaced.
    pub fn ensure(&self, claim_uid: &str, devices: &[CdiDevice]) -> Result<(Vec<String>, SpecState)> {
        let (path, bytes, ids) = self.render(claim_uid, devices)?;
        let state = on_disk(&path, &bytes)?;
        if state != SpecState::Intact {
            self.store(&path, &bytes)?;
        }
        Ok((ids, state))
    }

    /// What the claim's spec on disk is, compared with one holding exactly `devices`. Reads only.
    ///
    /// # Errors
    /// As [`CdiWriter::write`], before any I/O.
    pub fn check(&self, claim_uid: &str, devices: &[CdiDevice]) -> Result<SpecState> {
        let (path, bytes, _) = self.render(claim_uid, devices)?;
        on_disk(&path, &bytes)
    }

    /// The spec's path, its exact bytes and its devices' IDs; validated, nothing written.
    fn render(&self, claim_uid: &str, devices: &[CdiDevice]) -> Result<(PathBuf, Vec<u8>, Vec<String>)> {
        let path = self.spec_path(claim_uid)?;
        if devices.is_empty() {
            return Err(CdiError::NoDevices { uid: claim_uid.to_string() });
        }
        let mut seen = HashSet::new();
        for d in devices {
            d.validate()?;
            if !seen.insert(d.name.as_str()) {
                return Err(CdiError::BadDevice {
                    name: d.name.clone(),
                    reason: "the name appears twice in the claim's devices; each must be unique".into(),
                });
            }
        }
        let spec = Spec {
            cdi_version: CDI_VERSION.to_string(),
            kind: self.kind(),
            devices: devices.iter().map(CdiDevice::to_spec).collect(),
        };
        let mut bytes = serde_json::to_vec_pretty(&spec).expect("a spec always serializes");
        bytes.push(b'\n');
        Ok((path, bytes, spec.qualified_ids()))
    }

    /// Remove the claim's spec. A missing file is success, so unprepare can repeat. Not synced: a
    /// spec that a power loss brings back belongs to a claim the checkpoint no longer holds, or
    /// holds as `UnprepareStarted`, and recovery removes it.
    ///
    /// # Errors
    /// Bad UID or driver; [`CdiError::Io`].
    pub fn remove(&self, claim_uid: &str) -> Result<()> {
        let path = self.spec_path(claim_uid)?;
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(source) => Err(CdiError::Io { path, op: "remove", source }),
        }
    }

    /// The claim's spec, `None` when there is none.
    ///
    /// # Errors
    /// Bad UID or driver; [`CdiError::Io`]; [`CdiError::Parse`] for a file that is not a spec of
    /// this driver's kind.
    pub fn read(&self, claim_uid: &str) -> Result<Option<Spec>> {
        let path = self.spec_path(claim_uid)?;
        match fs::read(&path) {
            Ok(bytes) => self.parse(&path, &bytes).map(Some),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(source) => Err(CdiError::Io { path, op: "read", source }),
        }
    }

    /// The claim UID a spec file of this driver carries in its name (`<dir>/<driver>-claim_<uid>.json`),
    /// when it is a valid one: how a file [`CdiWriter::list`] could not read is still known as a
    /// claim's, and can be removed.
    pub fn claim_of(&self, path: &Path) -> Option<String> {
        if path.parent() != Some(self.dir.as_path()) {
            return None;
        }
        let uid = path.file_name()?.to_str()?.strip_prefix(&self.file_prefix())?.strip_suffix(".json")?;
        crate::names::is_uid(uid).then(|| uid.to_string())
    }

    /// Every spec of this driver in the directory, as (claim UID, spec), sorted by UID; used to
    /// rebuild a lost checkpoint. Files of this driver that cannot be read or parsed are returned in
    /// the second list with the reason, not as an error. Other files are ignored. A missing
    /// directory holds no specs.
    ///
    /// # Errors
    /// Bad driver; [`CdiError::Io`] when the directory cannot be listed.
    pub fn list(&self) -> Result<(Vec<(String, Spec)>, Unreadable)> {
        self.check_driver()?;
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
            Err(source) => return Err(CdiError::Io { path: self.dir.clone(), op: "list", source }),
        };
        let prefix = self.file_prefix();
        let mut specs = Vec::new();
        let mut bad = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| CdiError::Io { path: self.dir.clone(), op: "list", source })?;
            let file_name = entry.file_name();
            let Some(uid) = file_name.to_str().and_then(|n| n.strip_prefix(&prefix)?.strip_suffix(".json")) else {
                continue;
            };
            let path = entry.path();
            if !crate::names::is_uid(uid) {
                bad.push((path, format!("the claim UID {uid:?} in the file name is not [a-z0-9-]{{1,64}}")));
                continue;
            }
            match fs::read(&path) {
                Ok(bytes) => match self.parse(&path, &bytes) {
                    Ok(spec) => specs.push((uid.to_string(), spec)),
                    Err(e) => bad.push((path, e.to_string())),
                },
                Err(e) => bad.push((path, format!("failed to read: {e}"))),
            }
        }
        specs.sort_by(|a, b| a.0.cmp(&b.0));
        bad.sort();
        Ok((specs, bad))
    }

    fn parse(&self, path: &Path, bytes: &[u8]) -> Result<Spec> {
        let parse_err = |reason: String| CdiError::Parse { path: path.to_path_buf(), reason };
        let spec: Spec = serde_json::from_slice(bytes).map_err(|e| parse_err(e.to_string()))?;
        if spec.kind != self.kind() {
            return Err(parse_err(format!("kind is {:?}, expected {:?}", spec.kind, self.kind())));
        }
        Ok(spec)
    }

    /// Write one spec file atomically, not synced (see the module doc), creating the CDI directory
    /// if it is missing.
    fn store(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        // Runtimes and debugging users need to list the directory, whatever the umask.
        files::create_dir(&self.dir, DIR_MODE).map_err(io("create directory", &self.dir))?;
        files::write_atomic(path, bytes, SPEC_MODE, files::Durability::Atomic).map_err(|e| CdiError::Io {
            path: e.path,
            op: e.step.op(),
            source: e.source,
        })
    }
}

/// A claim's spec file compared with what migdra would write for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecState {
    Intact,
    Missing,
    Altered,
}

impl SpecState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Intact => "intact",
            Self::Missing => "missing",
            Self::Altered => "altered",
        }
    }
}

pub(super) fn on_disk(path: &Path, want: &[u8]) -> Result<SpecState> {
    match fs::read(path) {
        Ok(have) if have == want => Ok(SpecState::Intact),
        Ok(_) => Ok(SpecState::Altered),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(SpecState::Missing),
        // Unreadable (e.g. a directory put in its place): rewriting is the repair, and the rename
        // reports what really stands in the way.
        Err(_) => Ok(SpecState::Altered),
    }
}

/// Map an I/O error to [`CdiError::Io`] naming the operation and the path.
fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CdiError + 'a {
    move |source| CdiError::Io { path: path.to_path_buf(), op, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::{DeviceNode, device_name, gpu_device, mig_device};
    use std::os::unix::fs::PermissionsExt;

    const DRIVER: &str = "mig.slinky.slurm.net";
    const UID: &str = "0b6f4a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
    const MIG_UUID: &str = "MIG-5c0a1d2e-3f4b-5a6c-8d7e-9f0a1b2c3d4e";

    fn devices(uid: &str) -> Vec<CdiDevice> {
        vec![
            mig_device(device_name(uid, "gpu-1-mig-3g40gb-9-4"), 1, MIG_UUID, 12, 13, 508),
            gpu_device(device_name(uid, "gpu-2"), 2, "GPU-2"),
        ]
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn ensure_rewrites_a_deleted_or_changed_spec_and_leaves_an_intact_one() {
        let tmp = tempfile::tempdir().unwrap();
        let w = CdiWriter::new(tmp.path(), DRIVER);
        let path = w.spec_path(UID).unwrap();
        assert_eq!(w.check(UID, &devices(UID)).unwrap(), SpecState::Missing);
        let ids = w.write(UID, &devices(UID)).unwrap();
        let written = fs::read(&path).unwrap();
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(w.ensure(UID, &devices(UID)).unwrap(), (ids.clone(), SpecState::Intact));
        assert_eq!(fs::metadata(&path).unwrap().modified().unwrap(), mtime, "an intact spec is not rewritten");

        fs::remove_file(&path).unwrap();
        assert_eq!(w.check(UID, &devices(UID)).unwrap(), SpecState::Missing);
        assert_eq!(w.ensure(UID, &devices(UID)).unwrap(), (ids.clone(), SpecState::Missing));
        assert_eq!(fs::read(&path).unwrap(), written);

        fs::write(&path, b"{}").unwrap();
        assert_eq!(w.check(UID, &devices(UID)).unwrap(), SpecState::Altered);
        assert_eq!(w.ensure(UID, &devices(UID)).unwrap(), (ids, SpecState::Altered));
        assert_eq!(fs::read(&path).unwrap(), written);
        assert_eq!(names_in(tmp.path()), [path.file_name().unwrap().to_string_lossy()]);
    }

    #[test]
    fn kind_and_path_follow_the_contract() {
        let w = CdiWriter::new(Path::new("/var/run/cdi"), DRIVER);
        assert_eq!(w.kind(), "mig.slinky.slurm.net/claim");
        assert_eq!(
            w.spec_path(UID).unwrap(),
            Path::new("/var/run/cdi/mig.slinky.slurm.net-claim_0b6f4a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b.json")
        );
    }

    #[test]
    fn a_written_spec_reads_back_equal_and_its_ids_resolve() {
        let tmp = tempfile::tempdir().unwrap();
        let w = CdiWriter::new(tmp.path(), DRIVER);
        let ids = w.write(UID, &devices(UID)).unwrap();
        assert_eq!(
            ids,
            [
                format!("mig.slinky.slurm.net/claim={UID}-gpu-1-mig-3g40gb-9-4"),
                format!("mig.slinky.slurm.net/claim={UID}-gpu-2"),
            ]
        );
        let spec = w.read(UID).unwrap().unwrap();
        assert_eq!(spec.cdi_version, CDI_VERSION);
        assert_eq!(spec.devices, devices(UID).iter().map(CdiDevice::to_spec).collect::<Vec<_>>());
        for id in &ids {
            let (kind, name) = id.split_once('=').unwrap();
            assert_eq!(kind, spec.kind);
            assert!(spec.device(name).is_some(), "{id} does not resolve");
        }
        let mig = spec.device(&device_name(UID, "gpu-1-mig-3g40gb-9-4")).unwrap();
        assert_eq!(mig.env("NVIDIA_VISIBLE_DEVICES"), Some(MIG_UUID));
        assert_eq!(mig.env("CUDA_VISIBLE_DEVICES"), Some(MIG_UUID));

        let path = w.spec_path(UID).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o644);
        assert_eq!(names_in(tmp.path()), [path.file_name().unwrap().to_string_lossy()]);
        let json: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        let caps = &json["devices"][0]["containerEdits"]["deviceNodes"][4];
        assert_eq!(caps["type"], "c");
        assert_eq!(caps["fileMode"], 292);
    }

    #[test]
    fn a_missing_directory_is_created() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run/cdi");
        let w = CdiWriter::new(&dir, DRIVER);
        w.write(UID, &devices(UID)).unwrap();
        assert!(w.read(UID).unwrap().is_some());
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o755);
    }

    #[test]
    fn rewriting_replaces_and_remove_is_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let w = CdiWriter::new(tmp.path(), DRIVER);
        w.write(UID, &devices(UID)).unwrap();
        let one = vec![gpu_device(device_name(UID, "gpu-0"), 0, "GPU-0")];
        w.write(UID, &one).unwrap();
        assert_eq!(w.read(UID).unwrap().unwrap().devices.len(), 1);
        w.remove(UID).unwrap();
        assert_eq!(w.read(UID).unwrap(), None);
        w.remove(UID).unwrap();
        assert!(names_in(tmp.path()).is_empty());
        CdiWriter::new(&tmp.path().join("absent"), DRIVER).remove(UID).unwrap();
    }

    #[test]
    fn hostile_uids_are_refused_and_nothing_is_created() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cdi");
        let w = CdiWriter::new(&dir, DRIVER);
        let long = "a".repeat(300);
        for uid in ["../x", "a/b", "", &long, "A", "..", "a\0b", "/etc/passwd", "a.json"] {
            let err = w.write(uid, &devices("u")).unwrap_err();
            assert!(matches!(&err, CdiError::BadClaimUid { uid: u } if u == uid), "{uid:?}: {err}");
            assert!(err.to_string().contains("[a-z0-9-]"), "{err}");
            assert!(matches!(w.remove(uid), Err(CdiError::BadClaimUid { .. })));
            assert!(matches!(w.read(uid), Err(CdiError::BadClaimUid { .. })));
            assert!(matches!(w.spec_path(uid), Err(CdiError::BadClaimUid { .. })));
        }
        assert!(!dir.exists());
        assert_eq!(names_in(tmp.path()), Vec::<String>::new());
    }

    #[test]
    fn a_bad_driver_name_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        for driver in ["../evil", "a/b", "", "-x"] {
            let w = CdiWriter::new(tmp.path(), driver);
            assert!(matches!(w.write(UID, &devices(UID)), Err(CdiError::BadDriver { .. })), "{driver}");
            assert!(matches!(w.list(), Err(CdiError::BadDriver { .. })));
        }
        assert!(names_in(tmp.path()).is_empty());
    }

    #[test]
    fn invalid_device_lists_are_refused_before_touching_the_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("cdi");
        let w = CdiWriter::new(&dir, DRIVER);
        assert!(matches!(w.write(UID, &[]), Err(CdiError::NoDevices { .. })));
        let mut dup = devices(UID);
        dup.push(dup[0].clone());
        let err = w.write(UID, &dup).unwrap_err();
        assert!(err.to_string().contains("appears twice"), "{err}");
        let bad = vec![CdiDevice {
            name: "x/y".into(),
            env: vec![],
            device_nodes: vec![DeviceNode::host("/dev/a")],
            mounts: vec![],
        }];
        assert!(matches!(w.write(UID, &bad), Err(CdiError::BadDevice { .. })));
        assert!(!dir.exists());
    }

    #[test]
    fn a_failed_write_leaves_no_temp_file() {
        let tmp = tempfile::tempdir().unwrap();
        let w = CdiWriter::new(tmp.path(), DRIVER);
        // A non-empty directory where the spec should go makes the rename fail.
        let path = w.spec_path(UID).unwrap();
        fs::create_dir(&path).unwrap();
        fs::write(path.join("keep"), "x").unwrap();
        let err = w.write(UID, &devices(UID)).unwrap_err();
        assert!(matches!(err, CdiError::Io { op: "rename temp file over", .. }), "{err}");
        assert_eq!(names_in(tmp.path()), [path.file_name().unwrap().to_string_lossy()]);
    }

    #[test]
    fn list_finds_specs_and_reports_garbage() {
        let tmp = tempfile::tempdir().unwrap();
        let w = CdiWriter::new(tmp.path(), DRIVER);
        let other = "1a2b3c4d-0000-4000-8000-000000000000";
        w.write(UID, &devices(UID)).unwrap();
        w.write(other, &devices(other)).unwrap();
        let garbage = tmp.path().join(format!("{DRIVER}-claim_ffff.json"));
        fs::write(&garbage, "{not json").unwrap();
        let foreign_kind = tmp.path().join(format!("{DRIVER}-claim_eeee.json"));
        fs::write(&foreign_kind, r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[]}"#).unwrap();
        let bad_uid = tmp.path().join(format!("{DRIVER}-claim_BAD.json"));
        fs::write(&bad_uid, "{}").unwrap();
        // Not ours: another driver's spec, an unrelated file, a temp file.
        fs::write(tmp.path().join("k8s.gpu.nvidia.com-claim_aaaa.json"), "{}").unwrap();
        fs::write(tmp.path().join("nvidia.yaml"), "x").unwrap();
        fs::write(tmp.path().join(format!(".{DRIVER}-claim_dddd.json.tmp-1-0")), "{").unwrap();

        let (specs, bad) = w.list().unwrap();
        let uids: Vec<&str> = specs.iter().map(|(u, _)| u.as_str()).collect();
        assert_eq!(uids, [UID, other]);
        assert_eq!(specs[1].1, w.read(other).unwrap().unwrap());
        let bad_paths: Vec<&Path> = bad.iter().map(|(p, _)| p.as_path()).collect();
        assert_eq!(bad_paths, [bad_uid.as_path(), foreign_kind.as_path(), garbage.as_path()]);
        assert!(bad[1].1.contains("nvidia.com/gpu"), "{}", bad[1].1);
        assert!(matches!(w.read("ffff"), Err(CdiError::Parse { .. })));
        let owners: Vec<Option<String>> = bad.iter().map(|(p, _)| w.claim_of(p)).collect();
        assert_eq!(owners, [None, Some("eeee".to_string()), Some("ffff".to_string())], "BAD is no UID");
        assert_eq!(w.claim_of(&w.spec_path(UID).unwrap()).as_deref(), Some(UID));
        assert_eq!(w.claim_of(&tmp.path().join("sub").join(format!("{DRIVER}-claim_ffff.json"))), None);
        assert_eq!(w.claim_of(&tmp.path().join(format!(".{DRIVER}-claim_dddd.json.tmp-1-0"))), None);

        assert_eq!(CdiWriter::new(&tmp.path().join("absent"), DRIVER).list().unwrap(), (vec![], vec![]));
    }
}
