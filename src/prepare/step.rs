//! The points of prepare and unprepare where a test may stop the process, and the hook that
//! reaches them.

use super::Engine;
use std::sync::Arc;

/// A point in prepare or unprepare, right after a checkpoint write, a CDI spec change or an NVML
/// mutation. Tests kill the process (or panic) there to prove recovery.
///
/// Between `PrepareStarted` and `PrepareCompleted` the checkpoint holds the claim's intent only:
/// `GiCreated`, `CiCreated`, `MetadataWritten` and `CdiWritten` are the points where instances or
/// files exist that no checkpoint write has named yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    PrepareStarted,
    GiCreated,
    CiCreated,
    MetadataWritten,
    CdiWritten,
    PrepareCompleted,
    UnprepareStarted,
    CdiDeleted,
    CiDestroyed,
    GiDestroyed,
    ClaimDropped,
    /// Recovery after a reboot: the claims are marked for re-creation (one checkpoint write).
    RecreateMarked,
    /// Recovery or `migdra cleanup` destroyed an instance no claim explains.
    OrphanDestroyed,
    /// Recovery removed a CDI spec no claim holds.
    StaleSpecRemoved,
    /// The publisher created or replaced one ResourceSlice.
    SliceWritten,
    /// A claim's status (our device entries) was written to the API server.
    StatusWritten,
}

impl Step {
    pub const ALL: [Step; 11] = [
        Self::PrepareStarted,
        Self::GiCreated,
        Self::CiCreated,
        Self::MetadataWritten,
        Self::CdiWritten,
        Self::PrepareCompleted,
        Self::UnprepareStarted,
        Self::CdiDeleted,
        Self::CiDestroyed,
        Self::GiDestroyed,
        Self::ClaimDropped,
    ];

    /// The points of startup recovery and `migdra cleanup`, apart from [`Self::ALL`]: a kill
    /// there is tested by running recovery or cleanup again, not by a kubelet's retry.
    pub const RECOVERY: [Step; 3] = [Self::RecreateMarked, Self::OrphanDestroyed, Self::StaleSpecRemoved];

    /// The points of `serve`'s API writes, reached through [`reached`] (they are not the
    /// engine's): a kill there is tested by starting serve again.
    pub const API: [Step; 2] = [Self::SliceWritten, Self::StatusWritten];

    /// kebab-case name, as `MIGDRA_CRASH_AT` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::PrepareStarted => "prepare-started",
            Self::GiCreated => "gi-created",
            Self::CiCreated => "ci-created",
            Self::MetadataWritten => "metadata-written",
            Self::CdiWritten => "cdi-written",
            Self::PrepareCompleted => "prepare-completed",
            Self::UnprepareStarted => "unprepare-started",
            Self::CdiDeleted => "cdi-deleted",
            Self::CiDestroyed => "ci-destroyed",
            Self::GiDestroyed => "gi-destroyed",
            Self::ClaimDropped => "claim-dropped",
            Self::RecreateMarked => "recreate-marked",
            Self::OrphanDestroyed => "orphan-destroyed",
            Self::StaleSpecRemoved => "stale-spec-removed",
            Self::SliceWritten => "slice-written",
            Self::StatusWritten => "status-written",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().chain(Self::RECOVERY).chain(Self::API).find(|p| p.name() == s.trim())
    }
}

/// Called at every [`Step`].
pub type Hook = Arc<dyn Fn(Step) + Send + Sync>;

/// The process's hook for the points outside the engine ([`Step::API`]); set once, by the CLI of
/// a `crash-points` build.
static PROCESS_HOOK: std::sync::OnceLock<Hook> = std::sync::OnceLock::new();

/// Set the process's hook for [`reached`].
pub fn set_process_hook(hook: Hook) {
    let _ = PROCESS_HOOK.set(hook);
}

/// A point outside the engine was reached: call the process's hook, if any.
pub fn reached(step: Step) {
    if let Some(hook) = PROCESS_HOOK.get() {
        hook(step);
    }
}

impl Engine {
    /// Call `hook` at every [`Step`] (tests use it to crash there).
    pub fn with_hook(mut self, hook: Hook) -> Self {
        self.hook = Some(hook);
        self
    }

    pub(super) fn step(&self, step: Step) {
        if let Some(hook) = &self.hook {
            hook(step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_round_trips_through_its_name() {
        for step in Step::ALL {
            assert_eq!(Step::parse(step.name()), Some(step));
        }
        assert_eq!(Step::parse(" gi-created "), Some(Step::GiCreated));
        assert_eq!(Step::parse("GiCreated"), None);
        let names: std::collections::HashSet<_> = Step::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(names.len(), Step::ALL.len());
    }
}
