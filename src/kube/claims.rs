//! Where prepare finds a claim's allocation when running in a cluster: the ResourceClaim itself,
//! read from the API server.
//!
//! The kubelet's request names the claim (namespace, name, UID). We GET it, check that the UID is
//! the one the kubelet means (a claim deleted and re-created under the same name is another
//! claim), that the scheduler allocated it, and hand every result to the engine, which keeps
//! ours and refuses other pools. Transient API errors are retried with backoff inside the
//! kubelet's 45 s call budget.

use crate::claims::{AllocationResult, Claim, ClaimError, ClaimRef, ClaimSource, Origin};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::{Api, Client};
use std::time::Duration;
use tokio::runtime::Handle;

/// The kubelet gives a call 45 s (docs/facts/k8s-dra-api.md §2.3); leave room for NVML and the answer.
pub const LOOKUP_BUDGET: Duration = Duration::from_secs(30);

/// A failed lookup as [`super::error_text`] words it, with kube's error as its source.
#[derive(Debug, thiserror::Error)]
#[error("{}", super::error_text(.0))]
struct ApiError(#[source] kube::Error);

/// Claims read from the API server.
#[derive(Clone)]
pub struct KubeClaimSource {
    client: Client,
    runtime: Handle,
    budget: Duration,
}

impl KubeClaimSource {
    /// `runtime` runs the API calls; [`ClaimSource::get`] is called from blocking threads.
    pub fn new(client: Client, runtime: Handle) -> Self {
        Self { client, runtime, budget: LOOKUP_BUDGET }
    }

    /// A shorter retry budget (tests).
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    async fn fetch(&self, claim: &ClaimRef) -> Result<Option<ResourceClaim>, kube::Error> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
        super::retry_transient(self.budget, "claim lookup", || api.get_opt(&claim.name)).await
    }
}

impl ClaimSource for KubeClaimSource {
    fn get(&self, claim: &ClaimRef) -> crate::claims::Result<Option<Claim>> {
        let found = self.runtime.block_on(self.fetch(claim)).map_err(|source| ClaimError::Api {
            claim: claim.clone(),
            transient: super::transient(&source),
            source: Box::new(ApiError(source)),
        })?;
        let Some(found) = found else { return Ok(None) };
        let uid = found.metadata.uid.clone().unwrap_or_default();
        if uid != claim.uid {
            let found = Box::new(ClaimRef { uid, ..claim.clone() });
            return Err(ClaimError::Mismatch { expected: claim.clone(), found, origin: Origin::ApiServer });
        }
        let allocation = found.status.as_ref().and_then(|s| s.allocation.as_ref());
        let Some(allocation) = allocation else {
            return Err(ClaimError::NotAllocated { claim: claim.clone(), origin: Origin::ApiServer });
        };
        let results = allocation
            .devices
            .as_ref()
            .and_then(|d| d.results.as_ref())
            .map(|rs| {
                rs.iter()
                    .map(|r| AllocationResult {
                        request: r.request.clone(),
                        driver: r.driver.clone(),
                        pool: r.pool.clone(),
                        device: r.device.clone(),
                        admin_access: r.admin_access,
                    })
                    .collect()
            })
            .unwrap_or_default();
        let pod_claim_name = found
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::cdi::metadata::POD_CLAIM_NAME_ANNOTATION))
            .cloned();
        Ok(Some(Claim { claim: claim.clone(), results, pod_claim_name }))
    }
}
