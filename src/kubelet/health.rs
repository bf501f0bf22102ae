//! `DRAResourceHealth` v1 and v1alpha1: the health of every device we publish, streamed to the
//! kubelet.
//!
//! Each message carries the complete list (the kubelet marks devices it stops hearing about as
//! Unknown). A MIG device inherits its parent GPU's health, and is unhealthy on its own when its
//! instance is. The list is re-read from the backend every interval and sent when it changes, and
//! at least every [`HEARTBEAT`] so timestamps stay fresh.

use crate::mig::devices::GpuMode;
use crate::mig::naming::{DeviceName, NameStyle, PublishedName};
use crate::prepare::Engine;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// Longest gap between two messages.
pub const HEARTBEAT: Duration = Duration::from_secs(10);

pub struct HealthService {
    pub engine: Arc<Engine>,
    pub interval: Duration,
    /// Becomes true when the server drains for shutdown: every stream ends, so the connections
    /// carrying them can close once the last answers are sent.
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// (device name, healthy, why not)
type Snapshot = Vec<(String, bool, String)>;

/// Every published device of this node with its health.
pub fn snapshot(engine: &Engine) -> Snapshot {
    let backend = engine.backend();
    let healthy_gpus: Vec<(String, bool)> =
        backend.gpus().unwrap_or_default().into_iter().map(|g| (g.uuid, g.healthy)).collect();
    let style = engine.options().device_names;
    let mut out = Vec::new();
    for gpu in engine.gpus() {
        let minor = gpu.info.minor;
        let gpu_ok = healthy_gpus.iter().find(|(u, _)| *u == gpu.info.uuid).is_some_and(|(_, h)| *h);
        let because =
            |gi: Option<u32>| backend.unhealthy_reason(&gpu.info.uuid, gi).map_or(String::new(), |r| format!(": {r}"));
        let why = if gpu_ok { String::new() } else { format!("GPU {} is unhealthy{}", gpu.info.uuid, because(None)) };
        if gpu.mode == GpuMode::Full {
            let name = PublishedName::new(style, DeviceName::Gpu { minor }, gpu.slurm.index);
            out.push((name.to_string(), gpu_ok, why));
            continue;
        }
        let instances = backend.gpu_instances(&gpu.info.uuid).unwrap_or_default();
        let partitions: Vec<(u32, u32)> = match gpu.mode {
            GpuMode::Static => instances.iter().map(|i| (i.profile_id, i.start)).collect(),
            _ => gpu.model.profiles.iter().flat_map(|p| p.placements.iter().map(move |s| (p.id, *s))).collect(),
        };
        for (profile_id, start) in partitions {
            let Some(p) = gpu.model.profile(profile_id) else { continue };
            let instance = instances.iter().find(|i| i.profile_id == profile_id && i.start == start);
            // Named as the slices name it: a static instance by its first compute instance's Slurm
            // index (read only when names carry it).
            let prefixed = gpu.mode == GpuMode::Static && style == NameStyle::Slurm;
            let slurm_index = instance.filter(|_| prefixed).and_then(|i| {
                let ci = backend.compute_instances(&gpu.info.uuid, i.id).ok()?.into_iter().next()?;
                gpu.slurm.mig_index(i.id, ci.id)
            });
            let name =
                PublishedName::new(style, DeviceName::mig(minor, &p.name, profile_id, start), slurm_index).to_string();
            let sick = instance.filter(|i| !i.healthy);
            match sick {
                Some(i) if gpu_ok => {
                    out.push((name, false, format!("GPU instance {} is unhealthy{}", i.id, because(Some(i.id)))))
                }
                _ => out.push((name, gpu_ok, why.clone())),
            }
        }
    }
    out
}

/// The service of one health API version: both carry the same messages, in their own packages.
macro_rules! health_version {
    ($version:ident, $name:literal) => {
        #[tonic::async_trait]
        impl super::proto::$version::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream =
                Pin<Box<dyn Stream<Item = Result<super::proto::$version::NodeWatchResourcesResponse, Status>> + Send>>;

            async fn node_watch_resources(
                &self,
                _: Request<super::proto::$version::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                use super::proto::$version::{
                    DeviceHealth, DeviceIdentifier, HealthStatus, NodeWatchResourcesResponse,
                };
                tracing::info!(version = $name, "health stream opened");
                let message = |pool: &str, snapshot: &Snapshot| NodeWatchResourcesResponse {
                    devices: snapshot
                        .iter()
                        .map(|(name, ok, why)| DeviceHealth {
                            device: Some(DeviceIdentifier { pool_name: pool.to_string(), device_name: name.clone() }),
                            health: if *ok { HealthStatus::Healthy } else { HealthStatus::Unhealthy } as i32,
                            last_updated_time: unix_now(),
                            health_check_timeout_seconds: 0,
                            message: why.chars().take(MESSAGE_CHARS).collect(),
                        })
                        .collect(),
                };
                Ok(Response::new(Box::pin(self.watch(message))))
            }
        }
    };
}

health_version!(health_v1, "v1");
health_version!(health_v1alpha1, "v1alpha1");

/// The kubelet's limit on a health message.
const MESSAGE_CHARS: usize = 1024;

fn unix_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

impl HealthService {
    /// Messages made by `message` from each new snapshot, and at least every [`HEARTBEAT`], until
    /// the kubelet hangs up or the server stops.
    fn watch<M: Send + 'static>(
        &self,
        message: impl Fn(&str, &Snapshot) -> M + Send + 'static,
    ) -> tokio_stream::wrappers::ReceiverStream<Result<M, Status>> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let (engine, interval, mut stop) = (self.engine.clone(), self.interval, self.stop.clone());
        tokio::spawn(async move {
            let pool = engine.options().pool.clone();
            let mut last: Option<(Snapshot, Instant)> = None;
            loop {
                let e = engine.clone();
                let Ok(now) = tokio::task::spawn_blocking(move || snapshot(&e)).await else { break };
                let due = last.as_ref().is_none_or(|(prev, at)| *prev != now || at.elapsed() >= HEARTBEAT);
                if due {
                    if tx.send(Ok(message(&pool, &now))).await.is_err() {
                        break;
                    }
                    last = Some((now, Instant::now()));
                }
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    _ = stop.wait_for(|stopped| *stopped) => break,
                }
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}
