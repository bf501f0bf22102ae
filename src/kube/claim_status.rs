//! Claim status for slurm-bridge: after a prepare, `status.devices[]` carries one entry per device
//! of ours with condition Ready and the data docs/bridge-contract.md lists (MIG UUID, parent, Slurm index,
//! shards, placement, GI/CI IDs). A failed prepare writes Ready=False with the reason, so the
//! bridge can release its Slurm reservation; unprepare removes our entries.
//!
//! Only entries of our driver and pool are touched; the write goes through the status
//! subresource with the object's resourceVersion and is retried on conflict.

use crate::claims::ClaimRef;
use crate::prepare::PreparedDevice;
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::PostParams;
use kube::{Api, Client};
use std::time::Duration;

/// Condition type the bridge reads.
pub const READY: &str = "Ready";

/// Writes our entries of `status.devices`.
#[derive(Clone)]
pub struct StatusWriter {
    client: Client,
    driver: String,
    pool: String,
    budget: Duration,
}

/// What to write for one claim.
pub enum Outcome<'a> {
    Prepared(&'a [PreparedDevice]),
    Failed(&'a str),
    Unprepared,
}

impl StatusWriter {
    pub fn new(client: Client, driver: &str, pool: &str) -> Self {
        Self { client, driver: driver.to_string(), pool: pool.to_string(), budget: Duration::from_secs(60) }
    }

    /// How long one write keeps retrying.
    pub fn with_budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// Replace our entries of the claim's `status.devices` according to `outcome`. A claim that
    /// is gone, or was re-created under another UID, is left alone.
    ///
    /// # Errors
    /// The API server refused, or stayed unreachable for the whole budget.
    pub async fn write(&self, claim: &ClaimRef, outcome: Outcome<'_>) -> Result<(), kube::Error> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
        super::retry_transient(self.budget, "claim status write", || self.try_write(&api, claim, &outcome)).await
    }

    async fn try_write(
        &self,
        api: &Api<ResourceClaim>,
        claim: &ClaimRef,
        outcome: &Outcome<'_>,
    ) -> Result<(), kube::Error> {
        let Some(mut current) = api.get_opt(&claim.name).await? else { return Ok(()) };
        if current.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Ok(());
        }
        let generation = current.metadata.generation;
        let ours: Vec<String> = current
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .map(|rs| {
                rs.iter().filter(|r| r.driver == self.driver && r.pool == self.pool).map(|r| r.device.clone()).collect()
            })
            .unwrap_or_default();
        let status = current.status.get_or_insert_with(Default::default);
        let mut devices: Vec<AllocatedDeviceStatus> = status
            .devices
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|d| !(d.driver == self.driver && d.pool == self.pool))
            .collect();
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let condition = |ok: bool, reason: &str, message: String| Condition {
            type_: READY.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: message.chars().take(32 * 1024).collect(),
            last_transition_time: now.clone(),
            observed_generation: generation,
        };
        match outcome {
            Outcome::Prepared(prepared) => {
                for d in prepared.iter() {
                    devices.push(AllocatedDeviceStatus {
                        driver: self.driver.clone(),
                        pool: d.pool.clone(),
                        device: d.device.clone(),
                        conditions: Some(vec![condition(true, "Prepared", format!("CDI {}", d.cdi_ids.join(",")))]),
                        data: serde_json::to_value(&d.status).ok().map(RawExtension),
                        ..Default::default()
                    });
                }
            }
            Outcome::Failed(reason) => {
                for device in &ours {
                    devices.push(AllocatedDeviceStatus {
                        driver: self.driver.clone(),
                        pool: self.pool.clone(),
                        device: device.clone(),
                        conditions: Some(vec![condition(false, "PrepareFailed", (*reason).to_string())]),
                        ..Default::default()
                    });
                }
            }
            Outcome::Unprepared => {}
        }
        status.devices = if devices.is_empty() { None } else { Some(devices) };
        api.replace_status(&claim.name, &PostParams::default(), &current).await?;
        crate::prepare::reached(crate::prepare::Step::StatusWritten);
        Ok(())
    }
}

/// The [`Reporter`](crate::prepare::Reporter) that writes claim status: each write is tried
/// within a short budget (5 s) on the calling (blocking) thread, so the status is there when the
/// pod starts; if the API server is unreachable longer, it goes on in the background with a
/// longer one and the kubelet's call returns.
pub struct StatusReporter {
    writer: StatusWriter,
    events: Option<super::events::Recorder>,
    runtime: tokio::runtime::Handle,
    /// How long the kubelet's call waits for the write.
    inline: Duration,
}

impl StatusReporter {
    pub fn new(writer: StatusWriter, runtime: tokio::runtime::Handle) -> Self {
        Self { writer, runtime, events: None, inline: Duration::from_secs(5) }
    }

    /// Also post a Warning event on each claim whose prepare fails.
    pub fn with_events(mut self, events: super::events::Recorder) -> Self {
        self.events = Some(events);
        self
    }

    fn report(&self, claim: &ClaimRef, outcome: Outcome<'_>, owned: impl FnOnce() -> OwnedOutcome) {
        let quick = self.writer.clone().with_budget(self.inline);
        match self.runtime.block_on(quick.write(claim, outcome)) {
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(
                    claim = %claim.uid,
                    error = %e,
                    "claim status not written yet; retrying in the background"
                );
                let (writer, claim, outcome) = (self.writer.clone(), claim.clone(), owned());
                self.runtime.spawn(async move {
                    if let Err(e) = writer.write(&claim, outcome.borrow()).await {
                        tracing::error!(claim = %claim.uid, error = %e, "failed to write the claim status");
                    }
                });
            }
        }
    }
}

/// [`Outcome`] that owns its data, for a background retry.
enum OwnedOutcome {
    Prepared(Vec<PreparedDevice>),
    Failed(String),
    Unprepared,
}

impl OwnedOutcome {
    fn borrow(&self) -> Outcome<'_> {
        match self {
            Self::Prepared(d) => Outcome::Prepared(d),
            Self::Failed(e) => Outcome::Failed(e),
            Self::Unprepared => Outcome::Unprepared,
        }
    }
}

impl crate::prepare::Reporter for StatusReporter {
    fn prepared(&self, claim: &ClaimRef, devices: &[PreparedDevice]) {
        self.report(claim, Outcome::Prepared(devices), || OwnedOutcome::Prepared(devices.to_vec()));
    }

    fn failed(&self, claim: &ClaimRef, error: &str) {
        self.report(claim, Outcome::Failed(error), || OwnedOutcome::Failed(error.to_string()));
        if let Some(events) = &self.events {
            self.runtime.block_on(events.claim_failed(&claim.namespace, &claim.name, &claim.uid, error));
        }
    }

    fn unprepared(&self, claim: &ClaimRef) {
        self.report(claim, Outcome::Unprepared, || OwnedOutcome::Unprepared);
    }
}
