//! The kubelet-facing side: the DRA socket (DRAPlugin v1 and v1beta1, and resource health) and
//! the registration socket, served with tonic over Unix sockets.
//!
//! Order matters: the DRA socket is served before the registration socket exists, because the
//! kubelet connects to the endpoint as soon as it registers us. On shutdown the registration
//! socket goes first (the kubelet stops sending), then in-flight calls finish within the grace
//! period (and the DRA socket keeps answering for a short linger, while the kubelet has not yet
//! dropped the endpoint), then the DRA socket is removed.

pub mod authority;
pub mod client;
mod dra;
mod driver;
mod health;
pub mod proto;
mod registration;
mod sockets;

pub use driver::{Driver, MAX_CLAIMS_PER_CALL};
pub use health::snapshot as health_snapshot;
pub use registration::{DRA_V1, DRA_V1BETA1, HEALTH_V1, HEALTH_V1ALPHA1};
pub use sockets::{MAX_SOCKET_PATH, SocketPaths};

use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

/// Errors that stop the plugin.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("failed to create socket {path}: {source}")]
    Socket { path: String, source: std::io::Error },
    #[error("gRPC server on {path} failed: {source}")]
    Serve { path: String, source: tonic::transport::Error },
}

/// How the plugin serves the kubelet.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    pub driver: String,
    pub paths: SocketPaths,
    /// Serve `DRAResourceHealth` (v1 and v1alpha1) and advertise both.
    pub health: bool,
    /// How often device health is re-read.
    pub health_interval: Duration,
    /// How long in-flight calls may take to finish after SIGTERM.
    pub grace: Duration,
    /// How often the registration socket is checked for deletion.
    pub socket_check: Duration,
}

/// Registration and call counters, shared by the services; the readiness probe and metrics read it.
#[derive(Debug, Default)]
pub struct PluginState {
    registered: AtomicBool,
    /// NotifyRegistrationStatus calls that said registered.
    pub registrations: AtomicU64,
    /// NotifyRegistrationStatus calls that said refused.
    pub registration_failures: AtomicU64,
    last_error: Mutex<String>,
    /// Registration sockets re-created after the kubelet deleted them.
    pub socket_recreations: AtomicU64,
    calls: Mutex<Vec<CallRecord>>,
}

/// One finished prepare or unprepare of one claim.
#[derive(Debug, Clone)]
pub struct CallRecord {
    pub op: &'static str,
    pub took: Duration,
    pub ok: bool,
}

impl PluginState {
    pub fn is_registered(&self) -> bool {
        self.registered.load(Ordering::SeqCst)
    }

    pub fn set_registration(&self, registered: bool, error: &str) {
        self.registered.store(registered, Ordering::SeqCst);
        let counter = if registered { &self.registrations } else { &self.registration_failures };
        counter.fetch_add(1, Ordering::SeqCst);
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) = error.to_string();
    }

    /// The kubelet's last refusal reason, empty when registered.
    pub fn last_error(&self) -> String {
        self.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn record_call(&self, op: &'static str, took: Duration, ok: bool) {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: metrics aggregate these; keep the latest window only.
        if calls.len() >= 4096 {
            calls.drain(..2048);
        }
        calls.push(CallRecord { op, took, ok });
    }

    /// The recorded calls, oldest first.
    pub fn calls(&self) -> Vec<CallRecord> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Longest wait, after the last claim finished, for its answer to reach the kubelet and the
/// connections to close.
const DRAIN: Duration = Duration::from_secs(1);

/// How long the DRA socket keeps serving after the registration socket went, even with nothing in
/// flight (at most the grace period). The kubelet drops this endpoint only when its plugin
/// manager's reconciler, a 1 s loop, sees the registration socket gone; until then it may still
/// dial it. Seen on a real node during a rolling update: a prepare sent to the old pod's endpoint
/// failed with its socket already removed.
const LINGER: Duration = Duration::from_secs(2);

/// Serve the kubelet until `shutdown` completes, then shut down in order.
///
/// # Errors
/// A socket cannot be created or a server fails.
pub async fn serve(
    config: PluginConfig,
    driver: Arc<Driver>,
    state: Arc<PluginState>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), KubeletError> {
    let socket_err = |path: &std::path::Path| {
        let path = path.display().to_string();
        move |source| KubeletError::Socket { path, source }
    };
    let (stop_registration, registration_stopped) = watch::channel(false);
    let (stop_serving, serving_stopped) = watch::channel(false);

    let dra_path = config.paths.dra.clone();
    let listener = sockets::bind(&dra_path).map_err(socket_err(&dra_path))?;
    let dra_ino = sockets::inode(&dra_path);
    let health = health::HealthService {
        engine: driver.engine().clone(),
        interval: config.health_interval,
        stop: serving_stopped.clone(),
    };
    let health = config.health.then(|| {
        let health = Arc::new(health);
        (
            proto::health_v1::dra_resource_health_server::DraResourceHealthServer::from_arc(health.clone()),
            proto::health_v1alpha1::dra_resource_health_server::DraResourceHealthServer::from_arc(health),
        )
    });
    let (health_v1, health_v1alpha1) = health.unzip();
    let mut drain = serving_stopped;
    let dra_server = Server::builder()
        .add_service(proto::dra_v1::dra_plugin_server::DraPluginServer::new(dra::DraService(driver.clone())))
        .add_service(proto::dra_v1beta1::dra_plugin_server::DraPluginServer::new(dra::DraService(driver.clone())))
        .add_optional_service(health_v1)
        .add_optional_service(health_v1alpha1)
        .serve_with_incoming_shutdown(incoming(listener), async move {
            let _ = drain.wait_for(|stopped| *stopped).await;
        });
    let mut dra_task = tokio::spawn(dra_server);
    tracing::info!(
        socket = %dra_path.display(),
        "serving DRA v1, v1beta1{}",
        if config.health { " and health v1, v1alpha1" } else { "" }
    );

    let mut registration = tokio::spawn(registration_loop(config.clone(), state.clone(), registration_stopped));

    // A registration socket that cannot be (re-)created leaves the kubelet blind: fail loudly.
    let registration_result = tokio::select! {
        () = shutdown => {
            tracing::info!("shutting down: removing the registration socket first");
            let _ = stop_registration.send(true);
            registration.await
        }
        r = &mut registration => {
            tracing::error!("the registration socket failed; stopping");
            r
        }
    };
    // Wait for claims in flight, not for connections: the kubelet keeps its connection open. Keep
    // answering for LINGER too, while the kubelet may not have dropped this endpoint yet.
    let now = tokio::time::Instant::now();
    let (deadline, linger) = (now + config.grace, now + LINGER.min(config.grace));
    while (driver.inflight() > 0 || tokio::time::Instant::now() < linger) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match driver.inflight() {
        0 => tracing::info!("in-flight calls finished"),
        n => tracing::warn!(claims = n, grace = ?config.grace, "claims still in flight after the grace period"),
    }
    // A finished claim's answer may still be on its way: drain (GOAWAY, every open call answered,
    // health streams ended) instead of dropping the connections, for at most DRAIN.
    let _ = stop_serving.send(true);
    match tokio::time::timeout(DRAIN, &mut dra_task).await {
        Ok(Ok(Err(source))) => return Err(KubeletError::Serve { path: dra_path.display().to_string(), source }),
        Ok(_) => {}
        Err(_) => {
            tracing::warn!(drain = ?DRAIN, "connections still open after the drain; closing them");
            dra_task.abort();
        }
    }
    sockets::remove(&dra_path, dra_ino);
    match registration_result {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "registration task failed");
            Ok(())
        }
    }
}

/// Connections on a socket, each with its requests re-framed so that any `:authority` a gRPC
/// client sends over a Unix socket is accepted (see [`authority`]).
fn incoming(
    listener: tokio::net::UnixListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<authority::Reframed<tokio::net::UnixStream>>> {
    UnixListenerStream::new(listener).map(|conn| conn.map(authority::Reframed::serving))
}

/// Serve the registration socket; re-create it whenever it is deleted, until stopped.
async fn registration_loop(
    config: PluginConfig,
    state: Arc<PluginState>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), KubeletError> {
    let path = config.paths.registration.clone();
    loop {
        let listener =
            sockets::bind(&path).map_err(|source| KubeletError::Socket { path: path.display().to_string(), source })?;
        let ino = sockets::inode(&path);
        tracing::info!(socket = %path.display(), "registration socket ready");
        let service = registration::RegistrationService {
            driver: config.driver.clone(),
            endpoint: config.paths.dra.display().to_string(),
            health: config.health,
            state: state.clone(),
        };
        let (vanished_tx, vanished_rx) = watch::channel(false);
        let mut stop_one = stop.clone();
        let watch_path = path.clone();
        let check = config.socket_check;
        let until = async move {
            loop {
                tokio::select! {
                    _ = stop_one.changed() => return,
                    () = tokio::time::sleep(check) => {
                        if sockets::inode(&watch_path) != ino {
                            let _ = vanished_tx.send(true);
                            return;
                        }
                    }
                }
            }
        };
        Server::builder()
            .add_service(proto::registration::registration_server::RegistrationServer::new(service))
            .serve_with_incoming_shutdown(incoming(listener), until)
            .await
            .map_err(|source| KubeletError::Serve { path: path.display().to_string(), source })?;
        if *stop.borrow_and_update() || !*vanished_rx.borrow() {
            sockets::remove(&path, ino);
            return Ok(());
        }
        state.socket_recreations.fetch_add(1, Ordering::SeqCst);
        tracing::warn!(socket = %path.display(), "registration socket was deleted (kubelet restart?); re-creating it");
    }
}
