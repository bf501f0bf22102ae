//! The node daemon (`migdra serve`) as a library type: [`Daemon::start`] takes a [`Config`] and
//! the engine, recovers, and makes the node's files ready; [`Daemon::run`] serves the kubelet and
//! runs every background task under one supervisor until a shutdown future completes. The CLI only
//! turns flags into a `Config`; tests and other programs can run a daemon the same way.
//!
//! Order, logged: GPUs and Slurm indexes → recovery → publish status reset → (run) publisher and
//! claim follower, periodic tasks, metrics → DRA socket → registration socket → shutdown →
//! registration socket removed → in-flight calls drained within the grace period → background
//! tasks stopped and waited for → publish status removed.

pub mod health_request;
mod periodic;

use crate::claims::{ClaimSource, DirSource};
use crate::kube::claim_status::{StatusReporter, StatusWriter};
use crate::kube::claims::KubeClaimSource;
use crate::kube::publish_status::{self, PublishStatus};
use crate::kube::publisher::{DeviceSet, Publisher};
use crate::kubelet::{self, Driver, PluginConfig, PluginState, SocketPaths};
use crate::mig::taints::TaintPolicy;
use crate::packing::DeviceOrder;
use crate::prepare::Engine;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Where claims' allocations are read.
pub enum Claims {
    /// The API server: claims, slices, status and events through this client (`server` is its
    /// URL, for the log and the publish status).
    Api { client: kube::Client, server: String },
    /// A directory of ResourceClaim files, with no API server (nothing is published).
    Dir(PathBuf),
}

/// Everything the daemon needs besides the engine, already checked by whoever built it.
pub struct Config {
    pub driver: String,
    pub plugin_dir: PathBuf,
    pub registry_dir: PathBuf,
    /// The pod's UID: socket and status file names carry it, for seamless rolling upgrades.
    pub pod_uid: Option<String>,
    pub claims: Claims,
    /// Serve and advertise `DRAResourceHealth`.
    pub health: bool,
    pub health_interval: Duration,
    /// How long in-flight calls may take to finish after shutdown starts.
    pub grace: Duration,
    pub socket_check: Duration,
    /// The publisher's full check and the stale-claim sweep.
    pub resync: Duration,
    /// `None`: the layout the API server supports.
    pub layout: Option<crate::kube::slices::Layout>,
    pub device_set: DeviceSet,
    pub device_order: DeviceOrder,
    pub taints: TaintPolicy,
    /// Serve Prometheus metrics here.
    pub metrics: Option<SocketAddr>,
}

/// Why the daemon could not start or stopped on an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0}")]
    Recover(#[source] crate::prepare::PrepareError),
    #[error("failed to reset the publish status in {dir}: {reason}")]
    PublishStatus { dir: PathBuf, reason: String },
    #[error(
        "socket path {} is {} bytes, over Linux's {} for a Unix socket: give a shorter plugin or \
         registry directory (the kubelet's root directory)",
        path.display(), path.as_os_str().len(), crate::kubelet::MAX_SOCKET_PATH
    )]
    SocketPathTooLong { path: PathBuf },
    #[error("failed to listen on {addr} for metrics: {source}; pick a free port")]
    Metrics { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Kubelet(#[from] crate::kubelet::KubeletError),
}

/// A started daemon: recovered, its publish status reset, ready to serve.
pub struct Daemon {
    config: Config,
    engine: Arc<Engine>,
    paths: SocketPaths,
    status_file: PathBuf,
}

impl Daemon {
    /// Log the node's GPUs, recover the checkpoint against the hardware, and reset the publish
    /// status: before the sockets, so a restarted container of this pod is not ready on its
    /// predecessor's publication (until the sockets answer, the probe fails on them).
    pub fn start(config: Config, engine: Arc<Engine>) -> Result<Self, DaemonError> {
        let paths =
            SocketPaths::new(&config.plugin_dir, &config.registry_dir, &config.driver, config.pod_uid.as_deref());
        if let Some(long) = paths.too_long() {
            return Err(DaemonError::SocketPathTooLong { path: long.to_path_buf() });
        }
        log_gpus(&engine);
        log_recovery(&engine.recover().map_err(DaemonError::Recover)?);
        let status_file = publish_status::path(&config.plugin_dir, config.pod_uid.as_deref());
        let status = match config.claims {
            Claims::Dir(_) => PublishStatus::no_api_server(&publish_status::now()),
            Claims::Api { .. } => PublishStatus::starting(&publish_status::now()),
        };
        crate::files::create_dir(&config.plugin_dir, 0o750)
            .map_err(|e| e.to_string())
            .and_then(|()| status.write(&status_file).map_err(|e| e.to_string()))
            .map_err(|reason| DaemonError::PublishStatus { dir: config.plugin_dir.clone(), reason })?;
        Ok(Self { config, engine, paths, status_file })
    }

    /// Serve until `shutdown` completes, then drain, stop every background task and wait for it.
    /// Must run inside a Tokio runtime. The publish status file goes in the end, whatever the result:
    /// a deleted pod's file would otherwise stay in the plugin directory.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), DaemonError> {
        let status_file = self.status_file.clone();
        let result = self.serve(shutdown).await;
        let _ = std::fs::remove_file(&status_file);
        result
    }

    async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), DaemonError> {
        let Self { config, engine, paths, status_file } = self;
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        let state = Arc::new(PluginState::default());
        let (driver, claims): (Driver, Arc<dyn ClaimSource>) = match &config.claims {
            Claims::Dir(dir) => {
                tracing::info!(dir = %dir.display(), "claims from files; no API server");
                let claims: Arc<dyn ClaimSource> = Arc::new(DirSource::new(dir));
                (Driver::new(engine.clone(), claims.clone(), state.clone()), claims)
            }
            Claims::Api { client, server } => {
                tracing::info!(server = %server, "API server");
                let handle = tokio::runtime::Handle::current();
                let claims: Arc<dyn ClaimSource> = Arc::new(KubeClaimSource::new(client.clone(), handle.clone()));
                let pool = &engine.options().pool;
                let writer = StatusWriter::new(client.clone(), &config.driver, pool);
                let events = crate::kube::events::Recorder::new(client.clone(), pool);
                let reporter = Arc::new(StatusReporter::new(writer, handle).with_events(events.clone()));
                let publisher = publisher(&config, client, server, &engine, events, &status_file, &tasks, &stop);
                tasks.spawn(publisher.run(stop.clone().cancelled_owned()));
                (Driver::new(engine.clone(), claims.clone(), state.clone()).with_reporter(reporter), claims)
            }
        };
        {
            let (engine, dir) = (engine.clone(), config.plugin_dir.clone());
            tasks.spawn(periodic::every(config.health_interval, stop.clone().cancelled_owned(), move || {
                periodic::take_health_request(&engine, &dir);
                std::future::ready(())
            }));
        }
        {
            let engine = engine.clone();
            tasks.spawn(periodic::every(config.resync, stop.clone().cancelled_owned(), move || {
                periodic::sweep_stale_claims(engine.clone(), claims.clone())
            }));
        }
        if let Some(addr) = config.metrics {
            let listener =
                tokio::net::TcpListener::bind(addr).await.map_err(|source| DaemonError::Metrics { addr, source });
            let listener = match listener {
                Ok(l) => l,
                Err(e) => {
                    stop.cancel();
                    tasks.close();
                    tasks.wait().await;
                    return Err(e);
                }
            };
            let bound = listener.local_addr().map_or_else(|_| addr.to_string(), |a| a.to_string());
            tracing::info!(addr = %bound, "serving metrics at /metrics");
            let scraped = engine.clone();
            tasks.spawn(crate::metrics::serve(
                listener,
                move || crate::metrics::METRICS.render(Some(&scraped)),
                stop.clone().cancelled_owned(),
            ));
        }
        let plugin = PluginConfig {
            driver: config.driver.clone(),
            paths,
            health: config.health,
            health_interval: config.health_interval,
            grace: config.grace,
            socket_check: config.socket_check,
        };
        let signalled = stop.clone();
        let served = kubelet::serve(plugin, Arc::new(driver), state, async move {
            shutdown.await;
            signalled.cancel();
        })
        .await;
        // Also when the kubelet side stopped on an error: nothing runs on after the daemon.
        stop.cancel();
        tasks.close();
        tasks.wait().await;
        Ok(served?)
    }
}

/// The publisher, and with it the claim follower when a publication depends on what claims hold
/// (a profile allowlist, `--publish fitting`, a dynamic device order); otherwise no node lists and
/// watches every claim of the cluster for nothing.
#[allow(clippy::too_many_arguments)]
fn publisher(
    config: &Config,
    client: &kube::Client,
    server: &str,
    engine: &Arc<Engine>,
    events: crate::kube::events::Recorder,
    status_file: &std::path::Path,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) -> Publisher {
    let mut p = Publisher::new(client.clone(), engine.clone(), config.layout);
    let opts = engine.options();
    if !opts.profiles.is_all() || config.device_set == DeviceSet::Fitting || config.device_order.policy().is_dynamic() {
        let allocations = Arc::new(crate::kube::allocations::Allocations::default());
        let follow = crate::kube::allocations::follow(
            kube::Api::all(client.clone()),
            opts.driver.clone(),
            opts.pool.clone(),
            allocations.clone(),
        );
        // The follower runs until told to stop: it has no end of its own.
        let stopped = stop.clone();
        tasks.spawn(async move {
            tokio::select! {
                () = follow => {}
                () = stopped.cancelled() => {}
            }
        });
        p = p.with_allocations(allocations);
    }
    p.with_server(server)
        .with_status_file(status_file.to_path_buf())
        .with_events(events)
        .with_device_order(config.device_order)
        .with_taints(config.taints, config.health_interval)
        .with_resync(config.resync)
        .with_device_set(config.device_set)
}

fn log_gpus(engine: &Engine) {
    for g in engine.gpus() {
        let slurm_index = g.slurm.index.map_or_else(|| "none".to_string(), |i| i.to_string());
        tracing::info!(
            index = g.info.index,
            minor = g.info.minor,
            uuid = %g.info.uuid,
            model = %g.model.key,
            mode = g.mode.as_str(),
            slurm_index,
            slurm_source = %g.slurm.source,
            slurm_shards = g.slurm.shards,
            "GPU"
        );
    }
    let slurm = engine.slurm();
    tracing::info!(source = %slurm.source, rule = %slurm.rule, "Slurm GPU index");
    for n in &slurm.notes {
        if n.warning {
            tracing::warn!("Slurm GPU index: {}", n.message);
        } else {
            tracing::info!("Slurm GPU index: {}", n.message);
        }
    }
}

fn log_recovery(report: &crate::prepare::RecoveryReport) {
    if let Some((moved, reason)) = &report.corrupt {
        tracing::error!(
            moved_to = %moved.display(),
            %reason,
            rebuilt = report.rebuilt_claims.len(),
            "CHECKPOINT WAS CORRUPT: moved aside and rebuilt from CDI specs and the hardware"
        );
    }
    if report.boot_changed {
        tracing::warn!(
            claims = report.marked_for_recreate.len(),
            "node rebooted: claims will be re-created on the next prepare"
        );
    }
    for o in &report.orphans {
        tracing::warn!(
            gpu = %o.gpu,
            gi = o.gi_id,
            profile = o.profile_id,
            start = o.start,
            action = ?o.action,
            "MIG instance no claim explains"
        );
    }
    tracing::info!(checkpoint = report.checkpoint, "recovery done");
}
