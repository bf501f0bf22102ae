//! The DRA calls, independent of the wire version: v1 and v1beta1 both land here and call the
//! one prepare engine. Each claim runs on a blocking thread of its own (NVML and file I/O block),
//! so claims on different GPUs proceed in parallel, and a client that hangs up mid-call does not
//! cancel a prepare half-way: it finishes, and the kubelet's retry finds it done. Each claim runs
//! in one `claim` span (UID, namespace, name, devices) and is timed and counted in
//! [`crate::metrics::METRICS`].

use super::PluginState;
use crate::claims::{Claim, ClaimError, ClaimRef, ClaimSource};
use crate::metrics::METRICS;
use crate::prepare::{Engine, PrepareError, PreparedDevice, Reporter};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Semaphore;
use tonic::Status;

/// Most claims one call may carry; a kubelet sends the claims of one pod.
pub const MAX_CLAIMS_PER_CALL: usize = 1024;
/// Claims handled at once; more wait for a slot.
const PARALLEL_CLAIMS: usize = 32;

/// Result of one claim, keyed by UID in the response.
pub type ClaimResults<T> = BTreeMap<String, Result<T, String>>;

/// What the DRA services share.
pub struct Driver {
    engine: Arc<Engine>,
    claims: Arc<dyn ClaimSource>,
    state: Arc<PluginState>,
    slots: Arc<Semaphore>,
    /// Claims being prepared or unprepared right now, including those whose client hung up.
    inflight: Arc<AtomicUsize>,
    reporter: Option<Arc<dyn Reporter>>,
}

/// Counts one claim in flight until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn new(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Driver {
    pub fn new(engine: Arc<Engine>, claims: Arc<dyn ClaimSource>, state: Arc<PluginState>) -> Self {
        Self {
            engine,
            claims,
            state,
            slots: Arc::new(Semaphore::new(PARALLEL_CLAIMS)),
            inflight: Arc::default(),
            reporter: None,
        }
    }

    /// Report every claim's outcome (the claim status writer).
    pub fn with_reporter(mut self, reporter: Arc<dyn Reporter>) -> Self {
        self.reporter = Some(reporter);
        self
    }

    /// Claims being worked on now; shutdown waits for this to reach 0.
    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::SeqCst)
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// A call with claims is served whether or not the kubelet has confirmed the registration:
    /// the kubelet adds a plugin to its DRA manager before it calls NotifyRegistrationStatus, and
    /// sends calls to the newest plugin of a driver at once, so a prepare can come first (a pod
    /// created during a rolling update can hit that gap). The kubelet never sends an empty call: that is the
    /// readiness probe's question, answered Unavailable until the confirmation came.
    fn check(&self, n: usize) -> Result<(), Status> {
        if n == 0 && !self.state.is_registered() {
            return Err(Status::unavailable("migdra is not registered with the kubelet yet; retry"));
        }
        if n > MAX_CLAIMS_PER_CALL {
            return Err(Status::invalid_argument(format!(
                "{n} claims in one call; at most {MAX_CLAIMS_PER_CALL} are accepted"
            )));
        }
        Ok(())
    }

    /// Prepare every claim; one entry per distinct UID.
    ///
    /// # Errors
    /// A gRPC status for the whole call: an empty call before registration, or too many claims.
    pub async fn prepare(&self, claims: Vec<ClaimRef>) -> Result<ClaimResults<Vec<PreparedDevice>>, Status> {
        self.check(claims.len())?;
        let (engine, source) = (self.engine.clone(), self.claims.clone());
        let (state, reporter) = (self.state.clone(), self.reporter.clone());
        Ok(self
            .each(claims, move |claim| {
                let span = claim_span(&claim);
                let _in_span = span.enter();
                let started = std::time::Instant::now();
                let r = prepare_one(&engine, source.as_ref(), &claim, &span).map_err(|e| {
                    METRICS.error("prepare", &e.reason());
                    e.to_string()
                });
                METRICS.prepare.observe(started.elapsed());
                state.record_call("prepare", started.elapsed(), r.is_ok());
                if let Some(reporter) = reporter.as_ref().filter(|_| !claim.uid.is_empty() && !claim.name.is_empty()) {
                    match &r {
                        Ok(devices) => reporter.prepared(&claim, devices),
                        Err(e) => reporter.failed(&claim, e),
                    }
                }
                match &r {
                    Ok(d) => tracing::info!(devices = d.len(), "prepared"),
                    Err(e) => tracing::warn!(error = %e, "prepare failed"),
                }
                r
            })
            .await)
    }

    /// Unprepare every claim; unknown claims succeed.
    ///
    /// # Errors
    /// As [`Driver::prepare`].
    pub async fn unprepare(&self, claims: Vec<ClaimRef>) -> Result<ClaimResults<()>, Status> {
        self.check(claims.len())?;
        let engine = self.engine.clone();
        let (state, reporter) = (self.state.clone(), self.reporter.clone());
        Ok(self
            .each(claims, move |claim| {
                let span = claim_span(&claim);
                let _in_span = span.enter();
                if let Ok(cp) = engine.checkpoint()
                    && let Some(rec) = cp.claims.get(&claim.uid)
                {
                    let names: Vec<&str> = rec.devices.iter().map(|d| d.device.as_str()).collect();
                    span.record("device", names.join(","));
                }
                let started = std::time::Instant::now();
                let r = check_ref(&claim).and_then(|()| engine.unprepare(&claim.uid).map_err(ClaimFailure::Prepare));
                let r = r.map_err(|e| {
                    METRICS.error("unprepare", &e.reason());
                    e.to_string()
                });
                METRICS.unprepare.observe(started.elapsed());
                state.record_call("unprepare", started.elapsed(), r.is_ok());
                if let (Ok(()), Some(reporter)) = (&r, reporter.as_ref())
                    && !claim.name.is_empty()
                {
                    reporter.unprepared(&claim);
                }
                match &r {
                    Ok(()) => tracing::info!("unprepared"),
                    Err(e) => tracing::warn!(error = %e, "unprepare failed"),
                }
                r
            })
            .await)
    }

    /// Run `f` for each distinct claim on a blocking thread, at most [`PARALLEL_CLAIMS`] at once.
    async fn each<T: Send + 'static>(
        &self,
        claims: Vec<ClaimRef>,
        f: impl Fn(ClaimRef) -> Result<T, String> + Send + Sync + 'static,
    ) -> ClaimResults<T> {
        let f = Arc::new(f);
        let mut seen = std::collections::BTreeSet::new();
        let mut tasks = Vec::new();
        for claim in claims {
            if !seen.insert(claim.uid.clone()) {
                continue;
            }
            let (f, slots) = (f.clone(), self.slots.clone());
            let uid = claim.uid.clone();
            let guard = InFlight::new(&self.inflight);
            // Spawned, not awaited in place: a hung-up client must not cancel a prepare half-way.
            tasks.push((
                uid,
                tokio::spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    let r = tokio::task::spawn_blocking(move || f(claim)).await;
                    drop(guard);
                    r
                }),
            ));
        }
        let mut out = BTreeMap::new();
        for (uid, task) in tasks {
            let r = match task.await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) | Err(e) => Err(format!("internal error: {e}")),
            };
            out.insert(uid, r);
        }
        out
    }
}

/// The span every log line of one claim's prepare or unprepare carries: the claim's UID,
/// namespace and name, and its devices once known (comma-separated device names). The name is
/// `claim_name`, not `name`, which JSON logs already use for the span's own name.
fn claim_span(claim: &ClaimRef) -> tracing::Span {
    tracing::info_span!(
        "claim",
        claim_uid = %claim.uid,
        namespace = %claim.namespace,
        claim_name = %claim.name,
        device = tracing::field::Empty,
    )
}

/// Why one claim's prepare failed, in the words the kubelet gets and the class the metrics count.
#[derive(Debug, thiserror::Error)]
enum ClaimFailure {
    #[error("{0}")]
    BadRequest(String),
    #[error(transparent)]
    Lookup(ClaimError),
    #[error("claim {0} is not known to the claim source")]
    NotFound(ClaimRef),
    #[error(transparent)]
    Prepare(PrepareError),
}

impl ClaimFailure {
    /// The label of `migdra_errors_total`: `bad-request`, `claim-lookup`, `claim-not-found`, or
    /// the engine's own ([`PrepareError::reason`]).
    fn reason(&self) -> String {
        match self {
            Self::BadRequest(_) => "bad-request".into(),
            Self::Lookup(_) => "claim-lookup".into(),
            Self::NotFound(_) => "claim-not-found".into(),
            Self::Prepare(e) => e.reason(),
        }
    }
}

/// Check a claim reference before it is used anywhere: a lookup, a GPU, a file name.
fn check_ref(claim: &ClaimRef) -> Result<(), ClaimFailure> {
    if claim.uid.is_empty() {
        return Err(ClaimFailure::BadRequest("claim has an empty UID".into()));
    }
    claim.validate().map_err(|e| ClaimFailure::BadRequest(e.to_string()))
}

/// Prepare one claim.
fn prepare_one(
    engine: &Engine,
    source: &dyn ClaimSource,
    claim: &ClaimRef,
    span: &tracing::Span,
) -> Result<Vec<PreparedDevice>, ClaimFailure> {
    check_ref(claim)?;
    if claim.name.is_empty() || claim.namespace.is_empty() {
        return Err(ClaimFailure::BadRequest(format!("claim {} has an empty name or namespace", claim.uid)));
    }
    let found =
        source.get(claim).map_err(ClaimFailure::Lookup)?.ok_or_else(|| ClaimFailure::NotFound(claim.clone()))?;
    let ours = found.results.iter().filter(|r| r.driver == engine.options().driver);
    let names: Vec<&str> = ours.map(|r| r.device.as_str()).collect();
    span.record("device", names.join(","));
    // The kubelet's reference: the source matched it, and it is what the engine reports on.
    let found = Claim { claim: claim.clone(), ..found };
    engine.prepare_claim(&found).map_err(ClaimFailure::Prepare)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::{Claim, Origin, Result as ClaimResult};
    use crate::gpu::GpuBackend;
    use crate::gpu::sim::{SimBackend, SimSpec};
    use crate::prepare::Options;

    /// A claim source that must never be asked: the request is refused before any lookup.
    struct Unreachable;

    impl ClaimSource for Unreachable {
        fn get(&self, claim: &ClaimRef) -> ClaimResult<Option<Claim>> {
            panic!("looked up {claim} although the request was malformed");
        }
    }

    #[test]
    fn a_malformed_reference_is_refused_before_any_lookup_or_gpu_work() {
        let dir = tempfile::tempdir().unwrap();
        let sim = Arc::new(SimBackend::in_memory_seeded(&SimSpec::parse("h100-80gb:1").unwrap(), 1));
        let opts = Options::new("mig.slinky.slurm.net", "node-a", dir.path().join("state"), dir.path().join("cdi"));
        let engine = Engine::new(sim.clone(), opts).unwrap();
        let uid = "0b6f4a52-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
        let cases = [
            (ClaimRef::new("", "ml", "c"), "empty UID"),
            (ClaimRef::new("../../etc", "ml", "c"), "invalid claim UID \"../../etc\""),
            (ClaimRef::new("UPPER", "ml", "c"), "invalid claim UID \"UPPER\""),
            (ClaimRef::new(uid, "Bad_NS", "c"), "invalid claim namespace \"Bad_NS\""),
            (ClaimRef::new(uid, "ml", "a..b"), "invalid claim name \"a..b\""),
            (ClaimRef::new(uid, "", "c"), "empty name or namespace"),
        ];
        for (claim, want) in cases {
            let err = prepare_one(&engine, &Unreachable, &claim, &tracing::Span::none()).unwrap_err();
            assert_eq!(err.reason(), "bad-request", "{claim:?}");
            assert!(err.to_string().contains(want), "{claim:?}: {err}");
        }
        let gpu = sim.gpus().unwrap()[0].uuid.clone();
        assert!(sim.gpu_instances(&gpu).unwrap().is_empty(), "no GPU instance was created");
        assert!(engine.checkpoint().unwrap().claims.is_empty(), "nothing was checkpointed");
    }

    #[test]
    fn failures_carry_their_metrics_reason() {
        let claim = ClaimRef::new("u", "ml", "c");
        assert_eq!(ClaimFailure::NotFound(claim.clone()).reason(), "claim-not-found");
        assert_eq!(ClaimFailure::NotFound(claim).to_string(), "claim ml/c (u) is not known to the claim source");
        let lookup = ClaimError::NotAllocated { claim: ClaimRef::new("u", "ml", "c"), origin: Origin::ApiServer };
        assert_eq!(ClaimFailure::Lookup(lookup).reason(), "claim-lookup");
        let busy = PrepareError::Busy {
            claim: Box::new(ClaimRef::new("x", "", "")),
            device: "gpu-0".into(),
            source: std::io::Error::other("t"),
        };
        assert_eq!(ClaimFailure::Prepare(busy).reason(), "timeout");
    }
}
