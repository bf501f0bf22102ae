//! `migdra probe`: the DaemonSet's startup, readiness and liveness check. It asks the daemon what
//! the kubelet would: GetInfo on the registration socket, then a NodePrepareResources with no
//! claims on the endpoint GetInfo names, dialled the way the kubelet dials each socket. A socket
//! file alone proves nothing: a hung or dead daemon leaves its sockets behind.
//!
//! `--ready` (the readiness probe) also requires that the daemon's last publication of
//! ResourceSlices succeeded, as its publish status file says ([`crate::kube::publish_status`]):
//! a pod that cannot reach the API server serves the kubelet, but the scheduler never sees its
//! node's devices. Liveness stays the kubelet's check alone, so an API server outage does not
//! restart every migdra pod.

use super::{CliError, CliResult, Global, backend};
use crate::kube::publish_status::{self, PublishStatus};
use crate::kubelet::SocketPaths;
use crate::kubelet::client::{self, Version};
use crate::kubelet::proto::registration::InfoRequest;
use crate::kubelet::proto::registration::registration_client::RegistrationClient;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Pod UID (downward API), as serve reads it: it names this pod's sockets
    #[arg(long, env = "POD_UID")]
    pub pod_uid: Option<String>,
    /// How long both calls together may take before the daemon counts as hung; keep it below the
    /// probe's timeoutSeconds
    #[arg(long, env = "MIGDRA_PROBE_TIMEOUT", default_value = "3s", value_parser = crate::duration::parse)]
    pub timeout: Duration,
    /// Readiness: also require that the last publication of this node's ResourceSlices succeeded
    /// (with --claims-dir there is none to require)
    // No environment twin: the probes share the container's environment, and liveness must not
    // turn into readiness.
    #[arg(long)]
    pub ready: bool,
}

pub fn run(args: &Args, global: &Global, out: &mut dyn std::io::Write) -> CliResult {
    let plugin_dir = backend::plugin_dir(global);
    let paths =
        SocketPaths::new(&plugin_dir, &global.node.registry_dir, &global.node.driver_name, args.pod_uid.as_deref());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(format!("failed to start the runtime: {e}")))?;
    let started = Instant::now();
    // The timer needs the runtime's context, so it is made inside block_on.
    let asked = runtime.block_on(async {
        tokio::time::timeout(args.timeout, ask(&paths.registration, &global.node.driver_name)).await
    });
    let endpoint = asked
        .unwrap_or_else(|_| {
            Err(format!(
                "{}: no answer within {:?} (--timeout): the daemon is hung or overloaded",
                paths.registration.display(),
                args.timeout
            ))
        })
        .map_err(CliError::Failed)?;
    let took = started.elapsed().as_millis();
    let published = if args.ready {
        let status = PublishStatus::read(&publish_status::path(&plugin_dir, args.pod_uid.as_deref()))
            .and_then(|s| s.ready())
            .map_err(CliError::Failed)?;
        format!("; {status}")
    } else {
        String::new()
    };
    writeln!(
        out,
        "ok: {} registered, {} answered in {took} ms{published}",
        paths.registration.display(),
        endpoint.display()
    )?;
    Ok(())
}

/// Both calls; the DRA endpoint on success, else why not, in one line.
async fn ask(registration: &Path, driver: &str) -> Result<PathBuf, String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", registration.display());
    let channel = client::connect(registration, &client::registration_authority(registration))
        .await
        .map_err(|e| at(&crate::causes::with_causes(&e)))?;
    let info = RegistrationClient::new(channel)
        .get_info(InfoRequest {})
        .await
        .map_err(|s| at(&format!("GetInfo failed: {}", s.message())))?
        .into_inner();
    if info.name != driver {
        return Err(at(&format!("GetInfo names driver {:?}, expected {driver:?} (--driver-name)", info.name)));
    }
    let endpoint = PathBuf::from(&info.endpoint);
    let kubelet =
        client::TestKubelet::unregistered(&endpoint).await.map_err(|e| format!("{}: {e}", endpoint.display()))?;
    match kubelet.prepare(Version::V1, &[]).await {
        Ok(_) => Ok(endpoint),
        Err(s) if s.code() == tonic::Code::Unavailable => {
            Err(format!("{}: answers, but the kubelet has not registered migdra: {}", endpoint.display(), s.message()))
        }
        Err(s) => Err(format!("{}: NodePrepareResources failed: {}", endpoint.display(), s.message())),
    }
}
