//! Stale claims: a prepare that never finished (migdra killed part-way) leaves its claim
//! `PrepareStarted` with the instances made so far, and only the kubelet's retry or unprepare
//! ends it. The kubelet remembers the claims it asked for in its own checkpoint; when that was
//! lost and the pod is deleted before the retry, neither comes, and the instances would be held
//! for ever. The daemon asks the claim source about every such claim now and then and rolls
//! back those it no longer allocates to this node. A claim the source still allocates here, or
//! one it cannot answer for, is never touched.

use super::{Engine, PrepareError};
use crate::claims::{ClaimError, ClaimRef, ClaimSource};
use crate::state::ClaimState;
use serde::Serialize;

/// Why the claim source no longer allocates a claim to this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StaleReason {
    /// The claim is gone.
    Deleted,
    /// The name now belongs to a claim with another UID.
    Replaced,
    /// The claim exists without an allocation (deallocated).
    Deallocated,
    /// The claim is allocated, but none of its devices is in this node's pool.
    AllocatedElsewhere,
}

impl StaleReason {
    /// Every reason: the metric writes each from the start.
    pub const ALL: [StaleReason; 4] = [Self::Deleted, Self::Replaced, Self::Deallocated, Self::AllocatedElsewhere];

    /// The label value of the metric and the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deleted => "deleted",
            Self::Replaced => "replaced",
            Self::Deallocated => "deallocated",
            Self::AllocatedElsewhere => "allocated-elsewhere",
        }
    }
}

/// One stale claim and what rolling it back did.
#[derive(Debug)]
pub struct StaleClaim {
    pub claim: ClaimRef,
    pub reason: StaleReason,
    /// `Err` when the rollback failed (e.g. NVML says the instance is in use); the claim stays
    /// `UnprepareStarted` and the next sweep tries again.
    pub rollback: Result<(), PrepareError>,
}

/// What one sweep found.
#[derive(Debug, Default)]
pub struct Sweep {
    /// Claims left mid-prepare that were asked about.
    pub checked: usize,
    /// Of those, claims the source could not answer for (an API error): left alone.
    pub unknown: Vec<(ClaimRef, ClaimError)>,
    pub stale: Vec<StaleClaim>,
}

impl Engine {
    /// Ask `source` about every claim left `PrepareStarted` (or a retried rollback left
    /// `UnprepareStarted`) and roll back those no longer allocated to this node's pool.
    ///
    /// # Errors
    /// The checkpoint cannot be read.
    pub fn sweep_stale(&self, source: &dyn ClaimSource) -> Result<Sweep, PrepareError> {
        let cp = self.checkpoint().map_err(PrepareError::NodeCheckpoint)?;
        let mut sweep = Sweep::default();
        let unfinished = cp.claims.values().filter(|r| r.state != ClaimState::PrepareCompleted);
        for rec in unfinished {
            let claim = rec.claim();
            sweep.checked += 1;
            let reason = match source.get(&claim) {
                Ok(None) => StaleReason::Deleted,
                Err(ClaimError::Mismatch { .. }) => StaleReason::Replaced,
                Err(ClaimError::NotAllocated { .. }) => StaleReason::Deallocated,
                Ok(Some(found)) => {
                    let opts = self.options();
                    if found.results_for(&opts.driver).any(|r| r.pool == opts.pool) {
                        continue;
                    }
                    StaleReason::AllocatedElsewhere
                }
                Err(e) => {
                    sweep.unknown.push((claim, e));
                    continue;
                }
            };
            // Unprepare takes the claim's lock: a prepare of it still running finishes first.
            let rollback = self.unprepare(&claim.uid);
            sweep.stale.push(StaleClaim { claim, reason, rollback });
        }
        Ok(sweep)
    }
}
