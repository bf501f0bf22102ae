//! `migdra serve`: the node daemon's flags. They become a [`crate::daemon::Config`]; the daemon
//! ([`crate::daemon::Daemon`]) does the rest, in its logged order, until SIGTERM or SIGINT (a
//! second one exits at once), then exits 0. Flags are checked, and the kubeconfig read, before
//! anything is made.

use super::{CliError, CliResult, Global, backend};
use crate::daemon::{Claims, Config, Daemon, DaemonError};
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(format!("failed to start the runtime: {e}")))?;
    let claims = match &global.node.claims_dir {
        Some(dir) => Claims::Dir(dir.clone()),
        None => {
            let (client, server) = runtime.block_on(kube_client(kubeconfig))?;
            Claims::Api { client, server }
        }
    };
    let config = Config {
        driver: global.node.driver_name.clone(),
        plugin_dir: backend::plugin_dir(global),
        registry_dir: global.node.registry_dir.clone(),
        pod_uid: args.pod_uid.clone(),
        claims,
        health: args.health,
        health_interval: args.health_interval,
        grace: args.grace,
        socket_check: args.socket_check,
        resync: args.resync,
        layout: match global.node.slice_layout {
            super::SliceLayoutFlag::Auto => None,
            super::SliceLayoutFlag::Combined => Some(crate::kube::slices::Layout::Combined),
            super::SliceLayoutFlag::Split => Some(crate::kube::slices::Layout::Split),
        },
        device_set: args.publish,
        device_order: global.node.device_order.into(),
        taints,
        metrics: args.metrics_addr,
    };
    let engine = Arc::new(backend::engine(global)?);
    let daemon = Daemon::start(config, engine).map_err(flag_error)?;
    runtime.block_on(daemon.run(shutdown_signal())).map_err(flag_error)?;
    tracing::info!("stopped");
    Ok(())
}

/// The daemon's errors in the words of the flags that set what failed.
fn flag_error(e: DaemonError) -> CliError {
    match e {
        DaemonError::SocketPathTooLong { path } => CliError::Usage(format!(
            "socket path {} is {} bytes, over Linux's {} for a Unix socket: give a shorter \
             --plugin-dir or --registry-dir (the kubelet's --root-dir)",
            path.display(),
            path.as_os_str().len(),
            crate::kubelet::MAX_SOCKET_PATH
        )),
        DaemonError::PublishStatus { reason, .. } => {
            CliError::Failed(format!("failed to reset the publish status in --plugin-dir: {reason}"))
        }
        DaemonError::Metrics { addr, source } => {
            CliError::Failed(format!("failed to listen on --metrics-addr {addr}: {source}; pick a free port"))
        }
        e => CliError::Failed(e.to_string()),
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
