//! Prometheus metrics: a few counters and histograms in one process-wide registry, written in the
//! text exposition format (0.0.4) by hand and served by a tiny HTTP/1.1 handler.
//!
//! Off by default: `migdra serve --metrics-addr 127.0.0.1:9400`. One process is one plugin, so
//! the registry is a `static` ([`METRICS`]), like Prometheus clients' default registry; code that
//! counts something adds one line. Values that live elsewhere (checkpoint writes, the instances a
//! claim holds) are read when scraped, never duplicated.

use crate::prepare::Engine;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Histogram bucket bounds in seconds: a prepare takes milliseconds on the simulator, a second or
/// two on hardware, and up to the kubelet's timeout when the GPU is busy.
pub const BUCKETS: [f64; 15] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The process's metrics.
pub static METRICS: Metrics = Metrics::new();

/// One metric family as the exposition writes it: the registry the chart's dashboard and alerts
/// are checked against, so a query can only name what migdra serves.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    pub name: &'static str,
    /// `counter`, `gauge` or `histogram` (whose samples add `_bucket` with `le`, `_sum`, `_count`).
    pub kind: &'static str,
    pub labels: &'static [&'static str],
    pub help: &'static str,
}

/// Every family [`Metrics::render`] writes, in that order.
pub const FAMILIES: [Family; 9] = [
    Family {
        name: "migdra_prepare_duration_seconds",
        kind: "histogram",
        labels: &[],
        help: "Time to prepare one claim (NodePrepareResources), failures included.",
    },
    Family {
        name: "migdra_unprepare_duration_seconds",
        kind: "histogram",
        labels: &[],
        help: "Time to unprepare one claim (NodeUnprepareResources), failures included.",
    },
    Family {
        name: "migdra_errors_total",
        kind: "counter",
        labels: &["operation", "reason"],
        help: "Claims whose prepare or unprepare failed, by operation and reason.",
    },
    Family {
        name: "migdra_slice_publishes_total",
        kind: "counter",
        labels: &["result"],
        help: "Publishes of this node's ResourceSlices, by result (written, unchanged, failure).",
    },
    Family {
        name: "migdra_stale_claims_rolled_back_total",
        kind: "counter",
        labels: &["reason"],
        help: "Claims left mid-prepare whose instances were released because the API server no \
               longer allocates them to this node, by reason.",
    },
    Family {
        name: "migdra_checkpoint_writes_total",
        kind: "counter",
        labels: &[],
        help: "Atomic checkpoint writes by this process.",
    },
    Family {
        name: "migdra_mig_instances",
        kind: "gauge",
        labels: &["gpu", "profile"],
        help: "MIG instances held by claims in the checkpoint, by parent GPU (UUID) and profile \
               (every profile of this node's MIG GPUs is listed).",
    },
    Family {
        name: "migdra_gpu_healthy",
        kind: "gauge",
        labels: &["gpu", "reason"],
        help: "1 when the GPU (UUID) is healthy, 0 when it is not; reason: none, xid-<N> or lost.",
    },
    Family {
        name: "migdra_checkpoint_readable",
        kind: "gauge",
        labels: &[],
        help: "1 when the last scrape could read the checkpoint.",
    },
];

/// A latency histogram with the fixed [`BUCKETS`].
#[derive(Debug)]
pub struct Histogram {
    /// Observations at or below each bound (not cumulative; summed when written).
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in nanoseconds, so it stays an atomic integer.
    sum_nanos: AtomicU64,
}

impl Histogram {
    const fn new() -> Self {
        Self {
            buckets: [const { AtomicU64::new(0) }; BUCKETS.len()],
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Record one call that took `took`.
    pub fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn write(&self, out: &mut String, name: &str) {
        header(out, name);
        let mut cumulative = 0;
        for (bound, n) in BUCKETS.iter().zip(&self.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// Every metric the daemon keeps itself.
#[derive(Debug)]
pub struct Metrics {
    pub prepare: Histogram,
    pub unprepare: Histogram,
    /// (operation, reason) → failed claims.
    errors: Mutex<BTreeMap<(&'static str, String), u64>>,
    /// Publishes that wrote at least one slice.
    slice_publishes_written: AtomicU64,
    /// Publishes that found every slice as wanted.
    slice_publishes_unchanged: AtomicU64,
    slice_publishes_failed: AtomicU64,
    /// Reason → claims left mid-prepare that were rolled back because the API no longer
    /// allocates them here.
    stale_rolled_back: Mutex<BTreeMap<&'static str, u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub const fn new() -> Self {
        Self {
            prepare: Histogram::new(),
            unprepare: Histogram::new(),
            errors: Mutex::new(BTreeMap::new()),
            slice_publishes_written: AtomicU64::new(0),
            slice_publishes_unchanged: AtomicU64::new(0),
            slice_publishes_failed: AtomicU64::new(0),
            stale_rolled_back: Mutex::new(BTreeMap::new()),
        }
    }

    /// Count one failed claim of `op` (`prepare` or `unprepare`) for `reason` (see
    /// [`PrepareError::reason`](crate::prepare::PrepareError::reason)).
    pub fn error(&self, op: &'static str, reason: &str) {
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        *errors.entry((op, reason.to_string())).or_default() += 1;
    }

    /// Count one publish of the ResourceSlices: `Some(true)` wrote slices, `Some(false)` found
    /// them as wanted, `None` failed.
    pub fn slice_publish(&self, wrote: Option<bool>) {
        let counter = match wrote {
            Some(true) => &self.slice_publishes_written,
            Some(false) => &self.slice_publishes_unchanged,
            None => &self.slice_publishes_failed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Count one stale claim rolled back, by [`StaleReason`](crate::prepare::StaleReason).
    pub fn stale_rolled_back(&self, reason: crate::prepare::StaleReason) {
        let mut stale = self.stale_rolled_back.lock().unwrap_or_else(|p| p.into_inner());
        *stale.entry(reason.as_str()).or_default() += 1;
    }

    /// The exposition text: these metrics, plus what `engine` knows (checkpoint writes, the MIG
    /// instances its claims hold by GPU and profile, and each GPU's health).
    pub fn render(&self, engine: Option<&Engine>) -> String {
        let mut out = String::new();
        self.prepare.write(&mut out, "migdra_prepare_duration_seconds");
        self.unprepare.write(&mut out, "migdra_unprepare_duration_seconds");
        // Known label values are written at 0 from the start, so the first failure is an increase
        // that increase() counts (a series born at 1 is not); NVML's own codes are too many to
        // list, and the alert rules catch a series' birth for them.
        header(&mut out, "migdra_errors_total");
        let mut errors = self.errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for op in ["prepare", "unprepare"] {
            for reason in crate::prepare::PrepareError::REASONS {
                errors.entry((op, reason.to_string())).or_default();
            }
        }
        for ((op, reason), n) in &errors {
            let _ = writeln!(out, "migdra_errors_total{{operation=\"{op}\",reason=\"{}\"}} {n}", escape(reason));
        }
        header(&mut out, "migdra_slice_publishes_total");
        let results = [
            ("written", &self.slice_publishes_written),
            ("unchanged", &self.slice_publishes_unchanged),
            ("failure", &self.slice_publishes_failed),
        ];
        for (result, n) in results {
            let _ = writeln!(out, "migdra_slice_publishes_total{{result=\"{result}\"}} {}", n.load(Ordering::Relaxed));
        }
        header(&mut out, "migdra_stale_claims_rolled_back_total");
        let mut stale = self.stale_rolled_back.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for reason in crate::prepare::StaleReason::ALL {
            stale.entry(reason.as_str()).or_default();
        }
        for (reason, n) in &stale {
            let _ = writeln!(out, "migdra_stale_claims_rolled_back_total{{reason=\"{reason}\"}} {n}");
        }
        header(&mut out, "migdra_checkpoint_writes_total");
        let _ = writeln!(out, "migdra_checkpoint_writes_total {}", engine.map_or(0, Engine::checkpoint_writes));
        header(&mut out, "migdra_mig_instances");
        let mut instances: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut ok = 1;
        if let Some(engine) = engine {
            for g in engine.gpus().iter().filter(|g| g.info.mig_enabled) {
                for p in &g.model.profiles {
                    instances.entry((g.info.uuid.clone(), p.name.clone())).or_default();
                }
            }
            match engine.checkpoint() {
                Ok(cp) => {
                    for d in cp.claims.values().flat_map(|c| &c.devices) {
                        if let Some(m) = d.mig.as_ref().filter(|m| m.gi_id.is_some()) {
                            *instances.entry((d.gpu_uuid.clone(), m.profile.clone())).or_default() += 1;
                        }
                    }
                }
                Err(_) => ok = 0,
            }
        }
        for ((gpu, profile), n) in &instances {
            let _ =
                writeln!(out, "migdra_mig_instances{{gpu=\"{}\",profile=\"{}\"}} {n}", escape(gpu), escape(profile));
        }
        header(&mut out, "migdra_gpu_healthy");
        if let Some(engine) = engine {
            // A failed GPU listing says nothing about any one GPU: no samples, not zeros.
            let health = crate::prepare::node_health(engine).unwrap_or_default();
            for (g, h) in engine.gpus().iter().zip(&health) {
                let reason = match h.gpu {
                    None => "none".to_string(),
                    Some(crate::mig::taints::Cause::Xid(x)) => format!("xid-{x}"),
                    Some(crate::mig::taints::Cause::Lost) => "lost".to_string(),
                };
                let healthy = u8::from(h.gpu.is_none());
                let _ = writeln!(
                    out,
                    "migdra_gpu_healthy{{gpu=\"{}\",reason=\"{reason}\"}} {healthy}",
                    escape(&g.info.uuid)
                );
            }
        }
        header(&mut out, "migdra_checkpoint_readable");
        let _ = writeln!(out, "migdra_checkpoint_readable {ok}");
        out
    }
}

/// `# HELP` and `# TYPE` of a family of [`FAMILIES`].
fn header(out: &mut String, name: &str) {
    let (help, kind) = FAMILIES.iter().find(|f| f.name == name).map_or(("", "untyped"), |f| (f.help, f.kind));
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value as the text format wants it: `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Whether `addr` may serve metrics without `--metrics-allow-remote`: loopback only.
pub fn is_local(addr: &std::net::SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// Largest request head read; a scrape sends a few hundred bytes.
const MAX_REQUEST: usize = 8192;
/// Connections answered at once; more wait.
const MAX_CONNECTIONS: usize = 16;
/// A client must send its request within this time.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Serve `GET /metrics` (the text of `render`) on `listener` until `shutdown` completes. Each
/// connection gets one answer and is closed (HTTP/1.1 with `Connection: close`).
pub async fn serve<F>(listener: tokio::net::TcpListener, render: F, shutdown: impl std::future::Future<Output = ()>)
where
    F: Fn() -> String + Send + Sync + 'static,
{
    let render = std::sync::Arc::new(render);
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let render = render.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, render).await {
                tracing::debug!(%peer, error = %e, "metrics: connection failed");
            }
            drop(permit);
        });
    }
}

async fn answer<F>(mut stream: tokio::net::TcpStream, render: std::sync::Arc<F>) -> std::io::Result<()>
where
    F: Fn() -> String + Send + Sync + 'static,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::with_capacity(1024);
    let read = async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
            if buf.len() >= MAX_REQUEST {
                return Err(std::io::Error::other("request head too large"));
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok(())
    };
    let read_result = tokio::time::timeout(READ_TIMEOUT, read).await;
    let head = String::from_utf8_lossy(&buf);
    let mut first = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (first.next().unwrap_or_default(), first.next().unwrap_or_default());
    let path = target.split('?').next().unwrap_or_default();
    let (status, content_type, body) = match (read_result, method, path) {
        (Err(_) | Ok(Err(_)), _, _) => ("400 Bad Request", "text/plain", "bad request\n".to_string()),
        (_, "GET" | "HEAD", "/metrics") => {
            let body = tokio::task::spawn_blocking(move || render()).await.unwrap_or_default();
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body)
        }
        (_, "GET" | "HEAD", "/") => ("200 OK", "text/plain", "migdra metrics: GET /metrics\n".to_string()),
        (_, "GET" | "HEAD", _) => ("404 Not Found", "text/plain", "not found; GET /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain", "only GET\n".to_string()),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_in_inf() {
        let h = Histogram::new();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(120));
        let mut out = String::new();
        h.write(&mut out, "migdra_prepare_duration_seconds");
        let out = out.replace("migdra_prepare_duration_seconds", "x_seconds");
        assert!(out.starts_with("# HELP x_seconds Time to prepare one claim"), "{out}");
        assert!(out.contains("\n# TYPE x_seconds histogram\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"0.025\"} 1\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"0.05\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"60\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_seconds_count 3\n"), "{out}");
        assert!(out.contains("x_seconds_sum 120.0305\n"), "{out}");
    }

    #[test]
    fn every_family_has_help_and_type_even_before_any_call() {
        let m = Metrics::new();
        // Before any event, every stale reason and every fixed error reason is there at 0.
        let fresh = m.render(None);
        for reason in crate::prepare::StaleReason::ALL {
            let line = format!("migdra_stale_claims_rolled_back_total{{reason=\"{}\"}} 0\n", reason.as_str());
            assert!(fresh.contains(&line), "{line} missing:\n{fresh}");
        }
        assert!(fresh.contains("migdra_errors_total{operation=\"unprepare\",reason=\"checkpoint\"} 0\n"), "{fresh}");
        m.error("prepare", "nvml-in-use");
        m.error("prepare", "nvml-in-use");
        m.slice_publish(Some(true));
        let text = m.render(None);
        for f in FAMILIES {
            assert!(text.contains(&format!("# HELP {} {}\n", f.name, f.help)), "{}: {text}", f.name);
            assert!(text.contains(&format!("# TYPE {} {}\n", f.name, f.kind)), "{}: {text}", f.name);
        }
        assert!(text.contains("migdra_errors_total{operation=\"prepare\",reason=\"nvml-in-use\"} 2\n"), "{text}");
        assert!(text.contains("migdra_slice_publishes_total{result=\"written\"} 1\n"), "{text}");
    }

    /// Every sample `render` writes belongs to a family of [`FAMILIES`] and carries exactly its
    /// labels (`le` too on a histogram's buckets): the registry the chart's dashboard and alerts
    /// are checked against is what a scrape returns.
    #[test]
    fn every_sample_is_of_a_registered_family_with_its_labels() {
        use crate::gpu::GpuBackend;
        use crate::gpu::sim::{SimBackend, SimSpec};
        use crate::prepare::Options;
        let dir = tempfile::tempdir().unwrap();
        let sim =
            std::sync::Arc::new(SimBackend::in_memory(&SimSpec::parse("h100-80gb:2,a100-40gb:1:mig-off").unwrap()));
        let opts = Options::new("mig.slinky.slurm.net", "node-a", dir.path().join("state"), dir.path().join("cdi"));
        let engine = Engine::new(sim.clone(), opts).unwrap();
        let bad = sim.gpus().unwrap().remove(1).uuid;
        sim.set_gpu_health(&bad, false).unwrap();
        let m = Metrics::new();
        m.error("prepare", "nvml-in-use");
        m.stale_rolled_back(crate::prepare::StaleReason::Deleted);
        m.prepare.observe(Duration::from_millis(3));
        let text = m.render(Some(&engine));
        let mut seen = std::collections::BTreeSet::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (series, _) = line.rsplit_once(' ').unwrap();
            let (name, labels) = series.split_once('{').map_or((series, ""), |(n, l)| (n, l.trim_end_matches('}')));
            let keys: Vec<&str> =
                labels.split(',').filter(|l| !l.is_empty()).map(|l| l.split('=').next().unwrap()).collect();
            let family = FAMILIES
                .iter()
                .find(|f| {
                    name == f.name
                        || (f.kind == "histogram"
                            && [
                                f.name.to_string() + "_bucket",
                                f.name.to_string() + "_sum",
                                f.name.to_string() + "_count",
                            ]
                            .contains(&name.to_string()))
                })
                .unwrap_or_else(|| panic!("{line}: no registered family"));
            let mut want: Vec<&str> = family.labels.to_vec();
            if name.ends_with("_bucket") {
                want.push("le");
            }
            assert_eq!(keys, want, "{line}: labels of {}", family.name);
            seen.insert(family.name);
        }
        assert_eq!(seen.len(), FAMILIES.len(), "families without a sample: {text}");
        assert!(text.contains(&format!("migdra_gpu_healthy{{gpu=\"{bad}\",reason=\"xid-79\"}} 0\n")), "{text}");
        assert_eq!(text.matches("migdra_gpu_healthy{").count(), 3, "{text}");
        // Two MIG H100s: every profile of each listed, by GPU; the MIG-off A100 has none.
        let h100_profiles = engine.gpus()[0].model.profiles.len();
        assert_eq!(text.matches("migdra_mig_instances{").count(), 2 * h100_profiles, "{text}");
    }

    #[test]
    fn only_loopback_is_local() {
        assert!(is_local(&"127.0.0.1:9400".parse().unwrap()));
        assert!(is_local(&"[::1]:9400".parse().unwrap()));
        assert!(!is_local(&"0.0.0.0:9400".parse().unwrap()));
        assert!(!is_local(&"10.0.0.7:9400".parse().unwrap()));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
