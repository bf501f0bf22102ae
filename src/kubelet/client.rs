//! A kubelet, as far as a DRA plugin can tell: it registers the plugin over the registration
//! socket, then calls the DRA and health services over the endpoint the plugin gave. The demo and
//! the integration tests drive migdra with it, over the real sockets and the real protocol.
//!
//! It dials as the kubelet of 1.34–1.36 does, down to the HTTP/2 `:authority`: its plugin manager
//! dials the registration socket by path through grpc-go's passthrough resolver, which sends the
//! percent-encoded path; its DRA manager dials `unix:<endpoint>`, which sends `localhost`. A
//! stand-in that connected any other way once hid that the real kubelet could not register us.

use super::authority::{Reframed, grpc_go_authority};
use super::proto::health_v1::NodeWatchResourcesResponse;
use super::proto::registration::registration_client::RegistrationClient;
use super::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus};
use super::proto::{dra_v1, dra_v1beta1};
use super::proto::{health_v1, health_v1alpha1};
use crate::claims::ClaimRef;
use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// The `:authority` the kubelet's plugin manager sends on the registration socket at `path`.
pub fn registration_authority(path: &Path) -> String {
    grpc_go_authority(&path.to_string_lossy())
}

/// The `:authority` the kubelet's DRA manager sends on a plugin's endpoint.
pub const DRA_AUTHORITY: &str = "localhost";

/// Open a gRPC channel over the Unix socket at `path` whose requests carry `authority`.
///
/// # Errors
/// The socket does not answer.
pub async fn connect(path: &Path, authority: &str) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    let authority = authority.to_string();
    // tonic needs a URI, and http would refuse a socket path in it; the connection below puts
    // the authority a real client sends into every request instead.
    Endpoint::from_static("http://kubelet.invalid")
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_| {
            let (path, authority) = (path.clone(), authority.clone());
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(Reframed::sending_authority(stream, &authority)))
            }
        }))
        .await
}

/// The DRA API version a call uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V1beta1,
}

/// One prepared device as the kubelet sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub request_names: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_ids: Vec<String>,
}

/// Per-claim outcome: devices, or the plugin's error string.
pub type Prepared = std::collections::BTreeMap<String, Result<Vec<Device>, String>>;

/// A registered plugin, ready for calls.
#[derive(Debug, Clone)]
pub struct TestKubelet {
    pub info: PluginInfo,
    dra: Channel,
}

impl TestKubelet {
    /// Register the plugin behind `registration_socket` as the kubelet does: GetInfo, check it,
    /// connect to the endpoint, then NotifyRegistrationStatus(true).
    ///
    /// # Errors
    /// Any step fails; the message says which.
    pub async fn register(registration_socket: &Path) -> Result<Self, String> {
        let channel = connect(registration_socket, &registration_authority(registration_socket))
            .await
            .map_err(|e| format!("connect registration socket: {e}"))?;
        let mut reg = RegistrationClient::new(channel);
        let info = reg.get_info(InfoRequest {}).await.map_err(|e| format!("GetInfo: {e}"))?.into_inner();
        if info.r#type != "DRAPlugin" || !info.supported_versions.iter().any(|v| v == super::DRA_V1) {
            let error = format!("unsupported plugin {info:?}");
            let _ = reg
                .notify_registration_status(RegistrationStatus { plugin_registered: false, error: error.clone() })
                .await;
            return Err(error);
        }
        let dra = connect(&PathBuf::from(&info.endpoint), DRA_AUTHORITY)
            .await
            .map_err(|e| format!("connect {}: {e}", info.endpoint))?;
        reg.notify_registration_status(RegistrationStatus { plugin_registered: true, error: String::new() })
            .await
            .map_err(|e| format!("NotifyRegistrationStatus: {e}"))?;
        Ok(Self { info, dra })
    }

    /// A client for a DRA socket without registering (for calls before registration).
    ///
    /// # Errors
    /// The socket does not answer.
    pub async fn unregistered(dra_socket: &Path) -> Result<Self, String> {
        let dra = connect(dra_socket, DRA_AUTHORITY).await.map_err(|e| crate::causes::with_causes(&e))?;
        Ok(Self { info: PluginInfo::default(), dra })
    }

    /// NodePrepareResources.
    ///
    /// # Errors
    /// The gRPC status of the whole call.
    pub async fn prepare(&self, version: Version, claims: &[ClaimRef]) -> Result<Prepared, tonic::Status> {
        macro_rules! call {
            ($v:ident, $client:ty) => {{
                let request = $v::NodePrepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|c| $v::Claim { namespace: c.namespace.clone(), uid: c.uid.clone(), name: c.name.clone() })
                        .collect(),
                };
                let response = <$client>::new(self.dra.clone()).node_prepare_resources(request).await?.into_inner();
                response
                    .claims
                    .into_iter()
                    .map(|(uid, r)| {
                        let out = if r.error.is_empty() {
                            Ok(r.devices
                                .into_iter()
                                .map(|d| Device {
                                    request_names: d.request_names,
                                    pool: d.pool_name,
                                    device: d.device_name,
                                    cdi_ids: d.cdi_device_ids,
                                })
                                .collect())
                        } else {
                            Err(r.error)
                        };
                        (uid, out)
                    })
                    .collect()
            }};
        }
        Ok(match version {
            Version::V1 => call!(dra_v1, dra_v1::dra_plugin_client::DraPluginClient<Channel>),
            Version::V1beta1 => call!(dra_v1beta1, dra_v1beta1::dra_plugin_client::DraPluginClient<Channel>),
        })
    }

    /// NodeUnprepareResources: per-claim error strings, empty for success.
    ///
    /// # Errors
    /// The gRPC status of the whole call.
    pub async fn unprepare(
        &self,
        version: Version,
        claims: &[ClaimRef],
    ) -> Result<std::collections::BTreeMap<String, String>, tonic::Status> {
        macro_rules! call {
            ($v:ident, $client:ty) => {{
                let request = $v::NodeUnprepareResourcesRequest {
                    claims: claims
                        .iter()
                        .map(|c| $v::Claim { namespace: c.namespace.clone(), uid: c.uid.clone(), name: c.name.clone() })
                        .collect(),
                };
                let response = <$client>::new(self.dra.clone()).node_unprepare_resources(request).await?.into_inner();
                response.claims.into_iter().map(|(uid, r)| (uid, r.error)).collect()
            }};
        }
        Ok(match version {
            Version::V1 => call!(dra_v1, dra_v1::dra_plugin_client::DraPluginClient<Channel>),
            Version::V1beta1 => call!(dra_v1beta1, dra_v1beta1::dra_plugin_client::DraPluginClient<Channel>),
        })
    }

    /// Open the health stream as the 1.37 kubelet does: the newest version the plugin advertises;
    /// with none advertised, v1alpha1, which is what kubelets up to 1.36 call regardless.
    ///
    /// # Errors
    /// The plugin does not serve health.
    pub async fn watch_health(&self) -> Result<HealthStream, tonic::Status> {
        let advertised = |v: &str| self.info.supported_versions.iter().any(|s| s == v);
        if advertised(super::HEALTH_V1) {
            let stream = health_v1::dra_resource_health_client::DraResourceHealthClient::new(self.dra.clone())
                .node_watch_resources(health_v1::NodeWatchResourcesRequest {})
                .await?
                .into_inner();
            return Ok(HealthStream::V1(stream));
        }
        let stream = health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(self.dra.clone())
            .node_watch_resources(health_v1alpha1::NodeWatchResourcesRequest {})
            .await?
            .into_inner();
        Ok(HealthStream::V1alpha1(stream))
    }
}

/// A health stream of either version, read as v1 (as the 1.37 kubelet reads v1alpha1).
#[derive(Debug)]
pub enum HealthStream {
    V1(tonic::Streaming<NodeWatchResourcesResponse>),
    V1alpha1(tonic::Streaming<health_v1alpha1::NodeWatchResourcesResponse>),
}

impl HealthStream {
    /// The version the stream speaks, as advertised in `supported_versions`.
    pub fn version(&self) -> &'static str {
        match self {
            Self::V1(_) => super::HEALTH_V1,
            Self::V1alpha1(_) => super::HEALTH_V1ALPHA1,
        }
    }

    /// The next message; `None` when the plugin ended the stream.
    ///
    /// # Errors
    /// The stream failed.
    pub async fn message(&mut self) -> Result<Option<NodeWatchResourcesResponse>, tonic::Status> {
        use prost::Message;
        match self {
            Self::V1(s) => s.message().await,
            // The two versions are the same messages field for field, so the bytes of one are the other.
            Self::V1alpha1(s) => Ok(s
                .message()
                .await?
                .map(|m| NodeWatchResourcesResponse::decode(m.encode_to_vec().as_slice()).unwrap_or_default())),
        }
    }
}
