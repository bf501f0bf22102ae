//! `DRAPlugin` v1 and v1beta1: the same calls on two wire versions, both handled by [`Driver`].

use super::driver::Driver;
use super::proto::{dra_v1, dra_v1beta1};
use crate::claims::ClaimRef;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// One DRA service version, sharing the driver.
pub struct DraService(pub Arc<Driver>);

/// Both versions have the same messages (v1 adds `share_id`), so one macro writes both impls.
macro_rules! dra_service {
    ($v:ident, $($share:tt)*) => {
        #[tonic::async_trait]
        impl $v::dra_plugin_server::DraPlugin for DraService {
            async fn node_prepare_resources(
                &self,
                request: Request<$v::NodePrepareResourcesRequest>,
            ) -> Result<Response<$v::NodePrepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| ClaimRef { uid: c.uid, namespace: c.namespace, name: c.name })
                    .collect();
                let results = self.0.prepare(claims).await?;
                let claims = results
                    .into_iter()
                    .map(|(uid, r)| {
                        let response = match r {
                            Ok(devices) => $v::NodePrepareResourceResponse {
                                devices: devices
                                    .into_iter()
                                    .map(|d| $v::Device {
                                        request_names: d.requests,
                                        pool_name: d.pool,
                                        device_name: d.device,
                                        cdi_device_ids: d.cdi_ids,
                                        $($share)*
                                    })
                                    .collect(),
                                error: String::new(),
                            },
                            Err(error) => $v::NodePrepareResourceResponse { devices: Vec::new(), error },
                        };
                        (uid, response)
                    })
                    .collect();
                Ok(Response::new($v::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$v::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$v::NodeUnprepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|c| ClaimRef { uid: c.uid, namespace: c.namespace, name: c.name })
                    .collect();
                let results = self.0.unprepare(claims).await?;
                let claims = results
                    .into_iter()
                    .map(|(uid, r)| (uid, $v::NodeUnprepareResourceResponse { error: r.err().unwrap_or_default() }))
                    .collect();
                Ok(Response::new($v::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

dra_service!(dra_v1, share_id: None,);
dra_service!(dra_v1beta1,);
