//! Which libnvidia-ml to load: `--nvml-lib` as given, else the first of the usual places under
//! the driver root (`--driver-root`) for the architecture migdra runs on, else
//! [`DEFAULT_LIB`](super::DEFAULT_LIB) on the loader path.
//!
//! One chart release thereby serves x86-64 and Arm (GH200, GB200) nodes alike: each pod looks in
//! its own architecture's directories. Pure: the file system is asked through `exists`, so both
//! architectures are tested on any machine.

use super::DEFAULT_LIB;
use std::path::{Path, PathBuf};

/// Directories under a driver root that hold libnvidia-ml.so.1 for `arch`
/// (`std::env::consts::ARCH`), most specific first:
///
/// - `usr/lib/<triplet>`: Debian and Ubuntu, NVIDIA's installer there, and the GPU operator's
///   Ubuntu driver images;
/// - `usr/lib/<triplet>/nvidia/current`: Debian's own driver packages, whose link in
///   `usr/lib/<triplet>` goes through the host's `/etc/alternatives` (absolute, so broken when
///   seen from the container);
/// - `usr/lib64`: RHEL-like hosts (and the operator's RHEL and RHCOS images);
/// - `usr/lib`: distributions without a multiarch or lib64 directory.
///
/// An architecture without a Debian triplet here gets the last two.
pub fn lib_dirs(arch: &str) -> &'static [&'static str] {
    match arch {
        "x86_64" => &["usr/lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu/nvidia/current", "usr/lib64", "usr/lib"],
        "aarch64" => &["usr/lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu/nvidia/current", "usr/lib64", "usr/lib"],
        _ => &["usr/lib64", "usr/lib"],
    }
}

/// The files to try under `driver_root` for `arch`, in order.
pub fn candidates(driver_root: &Path, arch: &str) -> Vec<PathBuf> {
    lib_dirs(arch).iter().map(|dir| driver_root.join(dir).join(DEFAULT_LIB)).collect()
}

/// The first of `candidates` that `exists`.
pub fn first_existing(candidates: &[PathBuf], exists: impl Fn(&Path) -> bool) -> Option<&PathBuf> {
    candidates.iter().find(|p| exists(p))
}

/// The library to load, and how it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// `--nvml-lib`: loaded as given, wherever the driver root is.
    Explicit(PathBuf),
    /// The first candidate under the driver root that exists.
    Found(PathBuf),
    /// [`DEFAULT_LIB`] on the loader path. `tried`: the driver root's candidates, none of which
    /// exists (empty without a driver root), for the message if loading fails too.
    LoaderPath { tried: Vec<PathBuf> },
}

impl Choice {
    /// What to hand `dlopen`.
    pub fn path(&self) -> PathBuf {
        match self {
            Self::Explicit(p) | Self::Found(p) => p.clone(),
            Self::LoaderPath { .. } => PathBuf::from(DEFAULT_LIB),
        }
    }

    /// Which setting chose it, for the log: `--nvml-lib`, `--driver-root` or `loader path`.
    pub fn source(&self) -> &'static str {
        match self {
            Self::Explicit(_) => "--nvml-lib",
            Self::Found(_) => "--driver-root",
            Self::LoaderPath { .. } => "loader path",
        }
    }
}

/// The library `--nvml-lib` (`explicit`) and `--driver-root` (`driver_root`) name for a binary
/// built for `arch`, asking `exists` (`Path::exists` in the daemon, which follows links as
/// `dlopen` would) about each candidate.
pub fn choose(
    explicit: Option<&Path>,
    driver_root: Option<&Path>,
    arch: &str,
    exists: impl Fn(&Path) -> bool,
) -> Choice {
    if let Some(lib) = explicit {
        return Choice::Explicit(lib.to_path_buf());
    }
    let Some(root) = driver_root else { return Choice::LoaderPath { tried: Vec::new() } };
    let tried = candidates(root, arch);
    match first_existing(&tried, exists) {
        Some(found) => Choice::Found(found.clone()),
        None => Choice::LoaderPath { tried },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strs(paths: &[PathBuf]) -> Vec<String> {
        paths.iter().map(|p| p.display().to_string()).collect()
    }

    #[test]
    fn each_architecture_looks_in_its_own_triplet_first() {
        let root = Path::new("/driver-root");
        assert_eq!(
            strs(&candidates(root, "x86_64")),
            [
                "/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                "/driver-root/usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.1",
                "/driver-root/usr/lib64/libnvidia-ml.so.1",
                "/driver-root/usr/lib/libnvidia-ml.so.1",
            ]
        );
        assert_eq!(
            strs(&candidates(root, "aarch64")),
            [
                "/driver-root/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
                "/driver-root/usr/lib/aarch64-linux-gnu/nvidia/current/libnvidia-ml.so.1",
                "/driver-root/usr/lib64/libnvidia-ml.so.1",
                "/driver-root/usr/lib/libnvidia-ml.so.1",
            ]
        );
        assert_eq!(
            strs(&candidates(root, "powerpc64")),
            ["/driver-root/usr/lib64/libnvidia-ml.so.1", "/driver-root/usr/lib/libnvidia-ml.so.1"]
        );
        // Neither architecture ever loads the other's library.
        assert!(lib_dirs("x86_64").iter().all(|d| !d.contains("aarch64")));
        assert!(lib_dirs("aarch64").iter().all(|d| !d.contains("x86_64")));
    }

    #[test]
    fn the_first_that_exists_wins() {
        let c = candidates(Path::new("/r"), "aarch64");
        let on = |present: &'static [&'static str]| move |p: &Path| present.iter().any(|q| p == Path::new(q));
        // A Grace host with a stray lib64 copy: the triplet's comes first.
        let both = on(&["/r/usr/lib64/libnvidia-ml.so.1", "/r/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1"]);
        assert_eq!(first_existing(&c, both), Some(&c[0]));
        assert_eq!(first_existing(&c, on(&["/r/usr/lib/libnvidia-ml.so.1"])), Some(&c[3]));
        // An x86-64 layout holds nothing for an Arm binary.
        assert_eq!(first_existing(&c, on(&["/r/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"])), None);
    }

    #[test]
    fn explicit_wins_then_the_driver_root_then_the_loader_path() {
        let all = |_: &Path| true;
        let none = |_: &Path| false;
        let lib = Path::new("/driver-root/usr/lib64/libnvidia-ml.so.1");
        let root = Path::new("/driver-root");
        for arch in ["x86_64", "aarch64"] {
            assert_eq!(choose(Some(lib), Some(root), arch, all), Choice::Explicit(lib.into()));
            assert_eq!(choose(Some(lib), None, arch, none), Choice::Explicit(lib.into()));
        }
        assert_eq!(
            choose(None, Some(root), "x86_64", all),
            Choice::Found("/driver-root/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1".into())
        );
        assert_eq!(choose(None, None, "x86_64", all), Choice::LoaderPath { tried: vec![] });
        let fallback = choose(None, Some(root), "aarch64", none);
        assert_eq!(fallback, Choice::LoaderPath { tried: candidates(root, "aarch64") });
        assert_eq!(fallback.path(), Path::new(DEFAULT_LIB));
    }
}
