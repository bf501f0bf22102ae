//! `migdra serve`: the daemon. Runs in a fixed, logged order: logging → flags → GPUs and engine →
//! recovery → publish status reset → DRA socket → registration socket → wait for SIGTERM/SIGINT →
//! registration socket removed → in-flight calls drained within the grace period → publish
//! status removed → exit 0. With `--metrics-addr`, Prometheus metrics are served from just before
//! the DRA socket until shutdown.

use super::{CliError, CliResult, Global, backend};
use crate::claims::{ClaimSource, DirSource};
use crate::kube::claim_status::{StatusReporter, StatusWriter};
use crate::kube::claims::KubeClaimSource;
use crate::kube::publish_status::{self, PublishStatus};
use crate::kube::publisher::Publisher;
use crate::kubelet::{self, Driver, PluginConfig, PluginState, SocketPaths};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Pod UID (downward API): socket names carry it, for seamless rolling upgrades
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// Serve and advertise DRAResourceHealth (v1, and v1alpha1 for kubelets before 1.37)
    #[arg(long, env = "MIGDRA_HEALTH", default_value_t = true, action = clap::ArgAction::Set)]
    pub health: bool,
    /// How often device health is re-read, e.g. 1s or 250ms
    #[arg(long, env = "MIGDRA_HEALTH_INTERVAL", default_value = "1s", value_parser = crate::duration::parse)]
    pub health_interval: Duration,
    /// How long in-flight calls may take to finish after SIGTERM
    #[arg(long, env = "MIGDRA_GRACE", default_value = "25s", value_parser = crate::duration::parse)]
    pub grace: Duration,
    /// How often the registration socket is checked for deletion
    #[arg(long, env = "MIGDRA_SOCKET_CHECK", default_value = "1s", value_parser = crate::duration::parse)]
    pub socket_check: Duration,
    /// How often the published ResourceSlices are compared with the API server's even when no
    /// watch event came (drift is repaired at once when one does), and how often claims left
    /// mid-prepare are checked: those no longer allocated to this node are rolled back
    #[arg(long, env = "MIGDRA_RESYNC", default_value = "30s", value_parser = crate::duration::parse)]
    pub resync: Duration,
    /// Which devices of dynamic GPUs are published: all (every partition, always) or fitting
    /// (every device a claim holds, and only the partitions that can still be allocated beside
    /// them, published again after allocations and releases: fewer devices for the scheduler to
    /// evaluate, at up to one slice write per allocation)
    #[arg(long, env = "MIGDRA_PUBLISH", value_enum, default_value_t)]
    pub publish: crate::kube::publisher::DeviceSet,
    /// Log format: text, or one JSON object per line; a claim's lines carry its `claim` span
    /// (claim_uid, namespace, name, device)
    #[arg(long, env = "MIGDRA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Least severe log level written: error, warn, info, debug or trace. debug adds, among
    /// others, each connection whose HTTP/2 requests were refused or had their :authority replaced
    #[arg(long, env = "MIGDRA_LOG_LEVEL", default_value = "info", value_parser = parse_level)]
    pub log_level: tracing::Level,
    /// Serve Prometheus metrics at http://ADDR/metrics, e.g. 127.0.0.1:9400 (port 0 picks one and
    /// logs it). Off by default. Only loopback addresses are accepted unless --metrics-allow-remote
    #[arg(long, env = "MIGDRA_METRICS_ADDR", value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Let --metrics-addr be a non-loopback address (e.g. 0.0.0.0:9400): anyone who reaches it
    /// reads claim counts and latencies; there is no authentication
    #[arg(long, env = "MIGDRA_METRICS_ALLOW_REMOTE")]
    pub metrics_allow_remote: bool,
}

/// `127.0.0.1:9400`, `[::1]:9400`, or `localhost:9400`.
fn parse_metrics_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    let s = s.trim();
    if let Some(port) = s.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| format!("{s:?}: the port is not a number 0-65535"))?;
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| format!("{s:?} is not IP:PORT; use e.g. 127.0.0.1:9400"))
}

fn parse_level(s: &str) -> Result<tracing::Level, String> {
    s.trim().parse().map_err(|_| format!("{s:?} is not a log level; expected error, warn, info, debug or trace"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

fn init_logging(format: LogFormat, level: tracing::Level) {
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

pub fn run(args: &Args, global: &Global) -> CliResult {
    init_logging(args.log_format, args.log_level);
    if let Some(addr) = args.metrics_addr
        && !args.metrics_allow_remote
        && !crate::metrics::is_local(&addr)
    {
        return Err(CliError::Usage(format!(
            "--metrics-addr {addr} is not a loopback address; use 127.0.0.1:PORT, or add \
             --metrics-allow-remote to serve metrics to the network"
        )));
    }
    if args.resync < Duration::from_secs(1) {
        return Err(CliError::Usage(format!(
            "--resync {:?} is below 1s: every full check lists the node's slices; use e.g. 30s",
            args.resync
        )));
    }
    let taints = global.node.taint_policy()?;
    // Read before anything is made: a kubeconfig that is missing or not YAML is bad input.
    let kubeconfig = match global.node.kubeconfig.as_deref() {
        Some(path) => Some((path, read_kubeconfig(path)?)),
        None => None,
    };
    let engine = Arc::new(backend::engine(global)?);
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
    let report = engine.recover().map_err(|e| CliError::Failed(e.to_string()))?;
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

    // Before the sockets: a restarted container of this pod must not be ready on its
    // predecessor's publication (until the sockets answer, the probe fails on them).
    let plugin_dir = backend::plugin_dir(global);
    let status_file = publish_status::path(&plugin_dir, args.pod_uid.as_deref());
    let status = match global.node.claims_dir {
        Some(_) => PublishStatus::no_api_server(&publish_status::now()),
        None => PublishStatus::starting(&publish_status::now()),
    };
    crate::files::create_dir(&plugin_dir, 0o750)
        .map_err(|e| e.to_string())
        .and_then(|()| status.write(&status_file).map_err(|e| e.to_string()))
        .map_err(|e| CliError::Failed(format!("failed to reset the publish status in --plugin-dir: {e}")))?;
    let registry_dir = global.node.registry_dir.clone();
    let paths = SocketPaths::new(&plugin_dir, &registry_dir, &global.node.driver_name, args.pod_uid.as_deref());
    if let Some(long) = paths.too_long() {
        return Err(CliError::Usage(format!(
            "socket path {} is {} bytes, over Linux's {} for a Unix socket: give a shorter \
             --plugin-dir or --registry-dir (the kubelet's --root-dir)",
            long.display(),
            long.as_os_str().len(),
            crate::kubelet::MAX_SOCKET_PATH
        )));
    }
    let config = PluginConfig {
        driver: global.node.driver_name.clone(),
        paths,
        health: args.health,
        health_interval: args.health_interval,
        grace: args.grace,
        socket_check: args.socket_check,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(format!("failed to start the runtime: {e}")))?;
    let layout = match global.node.slice_layout {
        super::SliceLayoutFlag::Auto => None,
        super::SliceLayoutFlag::Combined => Some(crate::kube::slices::Layout::Combined),
        super::SliceLayoutFlag::Split => Some(crate::kube::slices::Layout::Split),
    };
    let publisher_status = status_file.clone();
    let result = runtime.block_on(async move {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let state = Arc::new(PluginState::default());
        let mut publisher = None;
        let mut allocations_follower: Option<tokio::task::JoinHandle<()>> = None;
        let (driver, claims) = match &global.node.claims_dir {
            Some(dir) => {
                tracing::info!(dir = %dir.display(), "claims from files; no API server");
                let claims: Arc<dyn ClaimSource> = Arc::new(DirSource::new(dir));
                (Driver::new(engine.clone(), claims.clone(), state.clone()), claims)
            }
            None => {
                let (client, server) = kube_client(kubeconfig).await?;
                tracing::info!(server = %server, "API server");
                let handle = tokio::runtime::Handle::current();
                let claims: Arc<dyn ClaimSource> = Arc::new(KubeClaimSource::new(client.clone(), handle.clone()));
                let writer = StatusWriter::new(client.clone(), &global.node.driver_name, &engine.options().pool);
                let events = crate::kube::events::Recorder::new(client.clone(), &engine.options().pool);
                let reporter = Arc::new(StatusReporter::new(writer, handle).with_events(events.clone()));
                let mut p = Publisher::new(client.clone(), engine.clone(), layout);
                // What claims hold matters only when a publication can leave a device out (a
                // profile allowlist, `--publish fitting`) or is ranked by them (best fit).
                // Otherwise no node lists and watches every claim of the cluster for nothing.
                let order: crate::packing::DeviceOrder = global.node.device_order.into();
                if !engine.options().profiles.is_all()
                    || args.publish == crate::kube::publisher::DeviceSet::Fitting
                    || order.policy().is_dynamic()
                {
                    let allocations = Arc::new(crate::kube::allocations::Allocations::default());
                    let (driver_name, pool) = (engine.options().driver.clone(), engine.options().pool.clone());
                    allocations_follower = Some(tokio::spawn(crate::kube::allocations::follow(
                        kube::Api::all(client),
                        driver_name,
                        pool,
                        allocations.clone(),
                    )));
                    p = p.with_allocations(allocations);
                }
                let p = p
                    .with_server(&server)
                    .with_status_file(publisher_status)
                    .with_events(events)
                    .with_device_order(order)
                    .with_taints(taints, args.health_interval)
                    .with_resync(args.resync)
                    .with_device_set(args.publish);
                publisher = Some(tokio::spawn(p.run(stopped(&stop_rx))));
                (Driver::new(engine.clone(), claims.clone(), state.clone()).with_reporter(reporter), claims)
            }
        };
        let driver = Arc::new(driver);
        let health_requests = {
            let (engine, dir) = (engine.clone(), plugin_dir.clone());
            tokio::spawn(every(args.health_interval, stopped(&stop_rx), move || {
                take_health_request(&engine, &dir);
                std::future::ready(())
            }))
        };
        let sweeper = {
            let engine = engine.clone();
            tokio::spawn(every(args.resync, stopped(&stop_rx), move || {
                sweep_stale_claims(engine.clone(), claims.clone())
            }))
        };
        let metrics = match args.metrics_addr {
            Some(addr) => {
                let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                    CliError::Failed(format!("failed to listen on --metrics-addr {addr}: {e}; pick a free port"))
                })?;
                let bound = listener.local_addr().map_or_else(|_| addr.to_string(), |a| a.to_string());
                tracing::info!(addr = %bound, "serving metrics at /metrics");
                let scraped = engine.clone();
                Some(tokio::spawn(crate::metrics::serve(
                    listener,
                    move || crate::metrics::METRICS.render(Some(&scraped)),
                    stopped(&stop_rx),
                )))
            }
            None => None,
        };
        let shutdown = async move {
            shutdown_signal().await;
            let _ = stop_tx.send(true);
        };
        let served = kubelet::serve(config, driver, state, shutdown).await;
        let _ = sweeper.await;
        let _ = health_requests.await;
        if let Some(p) = publisher {
            let _ = p.await;
        }
        if let Some(f) = allocations_follower {
            f.abort();
        }
        if let Some(m) = metrics {
            let _ = m.await;
        }
        served.map_err(|e| CliError::Failed(e.to_string()))
    });
    // Like the sockets: a deleted pod's file would otherwise stay in the plugin directory, and so
    // would a daemon's that stopped on an error.
    let _ = std::fs::remove_file(&status_file);
    result?;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves once the watch says stop: each background task's end.
fn stopped(rx: &tokio::sync::watch::Receiver<bool>) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut rx = rx.clone();
    async move {
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// Run `tick` every `period` (first after one period) until `stop`.
async fn every<F: std::future::Future<Output = ()>>(
    period: Duration,
    stop: impl std::future::Future<Output = ()>,
    mut tick: impl FnMut() -> F,
) {
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(period) => {}
        }
        tick().await;
    }
}

/// Take the operator's `migdra health clear` request, if any, and forget the errors of the GPUs
/// it names; the health stream and the taints follow on their next look.
fn take_health_request(engine: &crate::prepare::Engine, plugin_dir: &std::path::Path) {
    let uuids = match super::health::take_request(plugin_dir) {
        Ok(Some(uuids)) => uuids,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(error = %e, dir = %plugin_dir.display(), "health clear request unreadable");
            return;
        }
    };
    for uuid in uuids {
        match engine.backend().clear_health(&uuid) {
            Ok(()) => tracing::warn!(gpu = %uuid, "health cleared by the operator (migdra health clear)"),
            Err(e) => tracing::warn!(gpu = %uuid, error = %e, "health clear request names no GPU of this node"),
        }
    }
}

/// Roll back the claims left mid-prepare that the claim source no longer allocates to this node
/// ([`Engine::sweep_stale`](crate::prepare::Engine::sweep_stale)). The sweep reads the claim
/// source with blocking calls, so it runs on a blocking thread.
async fn sweep_stale_claims(engine: Arc<crate::prepare::Engine>, claims: Arc<dyn ClaimSource>) {
    let sweep = match tokio::task::spawn_blocking(move || engine.sweep_stale(claims.as_ref())).await {
        Ok(Ok(sweep)) => sweep,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "stale-claim check skipped");
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "stale-claim check failed");
            return;
        }
    };
    for (claim, e) in &sweep.unknown {
        tracing::debug!(%claim, error = %e, "claim left mid-prepare kept: its allocation could not be read");
    }
    for stale in &sweep.stale {
        match &stale.rollback {
            Ok(()) => {
                crate::metrics::METRICS.stale_rolled_back(stale.reason);
                tracing::warn!(claim = %stale.claim, reason = stale.reason.as_str(),
                    "claim left mid-prepare is no longer allocated to this node: rolled back, its instances released");
            }
            Err(e) => {
                crate::metrics::METRICS.error("unprepare", &e.reason());
                tracing::warn!(claim = %stale.claim, reason = stale.reason.as_str(), error = %e,
                    "claim left mid-prepare is no longer allocated to this node; rolling it back \
                     failed, the next check retries");
            }
        }
    }
}

pub(super) fn read_kubeconfig(path: &std::path::Path) -> Result<kube::config::Kubeconfig, CliError> {
    kube::config::Kubeconfig::read_from(path)
        .map_err(|e| CliError::Usage(format!("--kubeconfig {}: {e}", path.display())))
}

/// A client for `--kubeconfig` (already read), or in-cluster, then `~/.kube/config`, and its
/// server's URL.
pub(super) async fn kube_client(
    kubeconfig: Option<(&std::path::Path, kube::config::Kubeconfig)>,
) -> Result<(kube::Client, String), CliError> {
    let config = match kubeconfig {
        Some((path, kc)) => {
            let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| CliError::Usage(format!("--kubeconfig {}: {e}", path.display())))?;
            // A certificate authority without one PEM certificate in it is taken silently and
            // then fails every TLS handshake: a kubeconfig that can never work is bad input.
            if config.root_cert.as_ref().is_some_and(Vec::is_empty) {
                return Err(CliError::Usage(format!(
                    "--kubeconfig {}: its certificate authority holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                    path.display()
                )));
            }
            config
        }
        None => kube::Config::infer().await.map_err(|e| {
            CliError::Usage(format!(
                "no API server: {e}; run in a pod, pass --kubeconfig FILE, or --claims-dir DIR to \
                 run without Kubernetes"
            ))
        })?,
    };
    let server = config.cluster_url.to_string().trim_end_matches('/').to_string();
    let client = kube::Client::try_from(config)
        .map_err(|e| CliError::Failed(format!("failed to build the Kubernetes client: {e}")))?;
    Ok((client, server))
}

/// The first SIGTERM or SIGINT starts a graceful shutdown; a second one exits at once.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::warn!("second signal: exiting without waiting");
        // The operator asked twice: not waiting for in-flight calls is the point.
        #[allow(clippy::disallowed_methods)]
        std::process::exit(1);
    });
}
