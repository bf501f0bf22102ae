//! Whether this pod publishes its node's ResourceSlices, on disk for `migdra probe --ready`.
//!
//! A pod that answers the kubelet but cannot reach the API server publishes no slices, so the
//! scheduler never places a claim on its node; readiness must say so, and `kubectl rollout
//! status` wait for it. The publisher records each round's outcome in a small JSON file in the
//! plugin directory, beside this pod's sockets and named per pod UID like them (an old and a new
//! pod run side by side during a rolling upgrade), written atomically ([`crate::files`]).
//!
//! `migdra serve` writes [`State::NotYet`] first, before its sockets exist, so a restarted
//! container of the same pod never reads its predecessor's success; with `--claims-dir` it
//! writes [`State::NoApiServer`] instead, and readiness is the kubelet's check alone.

use crate::files::{self, Durability, WriteError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What the publisher last did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// serve started; no round has finished yet.
    NotYet,
    /// The last round made the published slices equal the node's.
    Published,
    /// The last round failed; the publisher retries with backoff.
    Failing,
    /// `--claims-dir`: no API server, so no publisher.
    NoApiServer,
}

/// The file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublishStatus {
    pub state: State,
    /// When this state began (RFC 3339, whole seconds): serve's start, or the first round of a
    /// run of successes or failures.
    pub since: String,
    /// When the last round ended; serve's start before the first one.
    pub at: String,
    /// The last round's error, one line naming the API server; only while failing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `<plugin-dir>/publish-status-<podUID>.json`, or `publish-status.json` without a pod UID
/// (the rule of [`crate::kubelet::SocketPaths`]).
pub fn path(plugin_dir: &Path, pod_uid: Option<&str>) -> PathBuf {
    match pod_uid.filter(|u| !u.is_empty()) {
        Some(uid) => plugin_dir.join(format!("publish-status-{uid}.json")),
        None => plugin_dir.join("publish-status.json"),
    }
}

/// Now, in whole seconds, as the file writes times.
pub fn now() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now).to_string()
}

impl PublishStatus {
    /// serve has started at `now` and will publish.
    pub fn starting(now: &str) -> Self {
        Self { state: State::NotYet, since: now.into(), at: now.into(), error: None }
    }

    /// serve has started at `now` with `--claims-dir`: nothing to publish.
    pub fn no_api_server(now: &str) -> Self {
        Self { state: State::NoApiServer, since: now.into(), at: now.into(), error: None }
    }

    /// After a round that ended at `now`: published, or failed with `error`.
    #[must_use]
    pub fn after(&self, now: &str, error: Option<String>) -> Self {
        let state = if error.is_some() { State::Failing } else { State::Published };
        let since = if state == self.state { self.since.clone() } else { now.to_string() };
        Self { state, since, at: now.into(), error }
    }

    /// Ready: what to add to the probe's answer; not ready: why, in one line.
    ///
    /// # Errors
    /// The publisher has not published yet, or its last round failed.
    pub fn ready(&self) -> Result<String, String> {
        match self.state {
            State::Published => Ok(format!("ResourceSlices published (checked {})", self.at)),
            State::NoApiServer => Ok("no API server (--claims-dir): not publishing".into()),
            State::NotYet => Err(format!("ResourceSlices not published yet (since {})", self.since)),
            State::Failing => Err(format!(
                "not publishing ResourceSlices (since {}): {}",
                self.since,
                self.error.as_deref().unwrap_or("no error recorded")
            )),
        }
    }

    /// Replace the file at `path` with this status.
    ///
    /// # Errors
    /// The plugin directory cannot be written.
    pub fn write(&self, path: &Path) -> Result<(), WriteError> {
        let mut text = serde_json::to_vec_pretty(self).unwrap_or_default();
        text.push(b'\n');
        // Written again by the next round: the rename alone is enough.
        files::write_atomic(path, &text, 0o644, Durability::Atomic)
    }

    /// The status at `path`.
    ///
    /// # Errors
    /// The file is missing or not a status, in one line naming it.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text =
            std::fs::read(path).map_err(|e| format!("{}: {e}: is serve of this pod running?", path.display()))?;
        serde_json::from_slice(&text).map_err(|e| format!("{}: not a publish status: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-01T00:00:05Z";
    const T2: &str = "2026-01-01T00:00:10Z";

    #[test]
    fn named_per_pod_uid_like_the_sockets() {
        let dir = Path::new("/p");
        assert_eq!(path(dir, Some("u-1")), Path::new("/p/publish-status-u-1.json"));
        assert_eq!(path(dir, None), Path::new("/p/publish-status.json"));
        assert_eq!(path(dir, Some("")), Path::new("/p/publish-status.json"));
    }

    #[test]
    fn since_is_the_first_round_of_a_run() {
        let start = PublishStatus::starting(T0);
        let failed = start.after(T1, Some("boom".into()));
        assert_eq!((failed.state, failed.since.as_str(), failed.at.as_str()), (State::Failing, T1, T1));
        let again = failed.after(T2, Some("boom again".into()));
        assert_eq!((again.since.as_str(), again.error.as_deref()), (T1, Some("boom again")));
        let ok = again.after(T2, None);
        assert_eq!((ok.state, ok.since.as_str(), ok.error), (State::Published, T2, None));
    }

    #[test]
    fn only_published_or_no_api_server_is_ready() {
        let start = PublishStatus::starting(T0);
        assert_eq!(start.ready().unwrap_err(), format!("ResourceSlices not published yet (since {T0})"));
        let failed = start.after(T1, Some("publishing ResourceSlices to https://10.96.0.1:443 failed: x".into()));
        let why = failed.ready().unwrap_err();
        assert_eq!(
            why,
            format!(
                "not publishing ResourceSlices (since {T1}): publishing ResourceSlices to \
                 https://10.96.0.1:443 failed: x"
            )
        );
        assert!(failed.after(T2, None).ready().unwrap().contains(T2));
        assert!(PublishStatus::no_api_server(T0).ready().is_ok());
    }

    #[test]
    fn round_trips_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path(), Some("u"));
        assert!(PublishStatus::read(&file).unwrap_err().contains("is serve of this pod running?"));
        let status = PublishStatus::starting(T0).after(T1, Some("boom".into()));
        status.write(&file).unwrap();
        assert_eq!(PublishStatus::read(&file).unwrap(), status);
        std::fs::write(&file, "{}").unwrap();
        assert!(PublishStatus::read(&file).unwrap_err().contains("not a publish status"));
    }

    #[test]
    fn now_is_rfc3339_in_whole_seconds() {
        let t = now();
        assert!(t.ends_with('Z') && !t.contains('.'), "{t}");
    }
}
