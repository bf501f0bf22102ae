//! Where the fake's settings come from: `fake-nvml.conf` beside the loaded library, else the
//! environment.

use std::path::{Path, PathBuf};

/// The settings file looked for beside the library.
pub const CONF_NAME: &str = "fake-nvml.conf";

/// The fake's settings; see the crate docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub state: PathBuf,
    pub procfs: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    /// The newest profile info struct version accepted: 2 or 3.
    pub profile_info_version: u32,
    pub unlisted: bool,
}

impl Config {
    /// The settings in force: the conf file beside this library when there is one, else the
    /// environment. `None` without a state file.
    pub fn load() -> Option<Config> {
        match own_dir().map(|d| d.join(CONF_NAME)).filter(|p| p.exists()) {
            Some(path) => {
                let text = std::fs::read_to_string(path).ok()?;
                Config::parse(|key| conf_value(&text, key))
            }
            None => Config::parse(|key| std::env::var(env_name(key)).ok()),
        }
    }

    /// Build from a key lookup.
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Option<Config> {
        let path = |k: &str| get(k).filter(|v| !v.trim().is_empty()).map(|v| PathBuf::from(v.trim()));
        Some(Config {
            state: path("state")?,
            procfs: path("procfs"),
            trace: path("trace"),
            profile_info_version: get("profile-info-version").and_then(|v| v.trim().parse().ok()).unwrap_or(3),
            unlisted: get("unlisted").is_some_and(|v| v.trim() == "1"),
        })
    }
}

/// `FAKE_NVML_<KEY>`.
fn env_name(key: &str) -> String {
    format!("FAKE_NVML_{}", key.to_ascii_uppercase().replace('-', "_"))
}

fn conf_value(text: &str, key: &str) -> Option<String> {
    text.lines().filter_map(|l| l.split_once('=')).find(|(k, _)| k.trim() == key).map(|(_, v)| v.trim().to_string())
}

/// The directory of the file this code was loaded from, found in `/proc/self/maps` by the
/// address of one of its functions.
fn own_dir() -> Option<PathBuf> {
    let addr = own_dir as fn() -> Option<PathBuf> as usize;
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (lo, hi) = fields.next()?.split_once('-')?;
        let (lo, hi) = (usize::from_str_radix(lo, 16).ok()?, usize::from_str_radix(hi, 16).ok()?);
        if !(lo..hi).contains(&addr) {
            return None;
        }
        let path = fields.nth(4)?;
        Path::new(path).parent().map(Path::to_path_buf)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_keys_and_defaults() {
        let text = "state = /tmp/s.json\nprocfs=/tmp/proc\nprofile-info-version=2\nunlisted=1\n";
        let c = Config::parse(|k| conf_value(text, k)).unwrap();
        assert_eq!(c.state, PathBuf::from("/tmp/s.json"));
        assert_eq!(c.procfs, Some(PathBuf::from("/tmp/proc")));
        assert_eq!((c.trace, c.profile_info_version, c.unlisted), (None, 2, true));
        let c = Config::parse(|k| (k == "state").then(|| "s.json".to_string())).unwrap();
        assert_eq!((c.profile_info_version, c.unlisted), (3, false));
        assert!(Config::parse(|_| None).is_none());
        assert_eq!(env_name("profile-info-version"), "FAKE_NVML_PROFILE_INFO_VERSION");
    }

    #[test]
    fn this_code_finds_the_file_it_was_loaded_from() {
        assert!(own_dir().is_some_and(|d| d.is_dir()));
    }
}
