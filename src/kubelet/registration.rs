//! `pluginregistration.Registration`: how the kubelet learns about us.

use super::PluginState;
use super::proto::registration::registration_server::Registration;
use super::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The `supported_versions` strings (not the gRPC service names; docs/facts/k8s-dra-api.md §1.4), v1 first because
/// the kubelet takes the first it knows.
pub const DRA_V1: &str = "v1.DRAPlugin";
pub const DRA_V1BETA1: &str = "v1beta1.DRAPlugin";
/// The 1.37 kubelet takes the first health service it knows from the list; older ones use v1alpha1
/// whatever the list says.
pub const HEALTH_V1: &str = "v1.DRAResourceHealth";
pub const HEALTH_V1ALPHA1: &str = "v1alpha1.DRAResourceHealth";

pub struct RegistrationService {
    pub driver: String,
    pub endpoint: String,
    pub health: bool,
    pub state: Arc<PluginState>,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        let mut versions = vec![DRA_V1.to_string(), DRA_V1BETA1.to_string()];
        if self.health {
            versions.extend([HEALTH_V1.to_string(), HEALTH_V1ALPHA1.to_string()]);
        }
        Ok(Response::new(PluginInfo {
            r#type: "DRAPlugin".into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: versions,
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = %self.driver, "registered with the kubelet");
        } else {
            tracing::error!(driver = %self.driver, error = %status.error, "the kubelet refused the registration");
        }
        self.state.set_registration(status.plugin_registered, &status.error);
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}
