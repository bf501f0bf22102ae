//! Kubernetes Events, where operators look first: Warning events on a claim whose prepare failed
//! and on the Node when publishing slices fails.
//!
//! A repeated failure (the kubelet retries every few seconds) updates one Event, named after the
//! object and the reason, and bumps its count instead of creating a new one each time.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::PostParams;
use kube::{Api, Client};

/// How long posting one event may take.
const POST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Who reports the events (`source.component`).
pub const COMPONENT: &str = "migdra";

/// Posts Warning events.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    node: String,
}

impl Recorder {
    pub fn new(client: Client, node: &str) -> Self {
        Self { client, node: node.to_string() }
    }

    /// A prepare of this claim failed.
    pub async fn claim_failed(&self, namespace: &str, name: &str, uid: &str, message: &str) {
        let object = ObjectReference {
            api_version: Some("resource.k8s.io/v1".into()),
            kind: Some("ResourceClaim".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..Default::default()
        };
        self.warn(namespace, object, "PrepareFailed", message).await;
    }

    /// Publishing this node's slices failed.
    pub async fn node_warning(&self, reason: &str, message: &str) {
        let object = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            ..Default::default()
        };
        self.warn("default", object, reason, message).await;
    }

    /// Bounded by [`POST_TIMEOUT`]: events are posted on failure paths, often while the API
    /// server is the trouble, and must not hold up the retry they report.
    async fn warn(&self, namespace: &str, object: ObjectReference, reason: &str, message: &str) {
        if tokio::time::timeout(POST_TIMEOUT, self.post(namespace, object, reason, message)).await.is_err() {
            tracing::debug!(reason, "posting an event timed out");
        }
    }

    async fn post(&self, namespace: &str, object: ObjectReference, reason: &str, message: &str) {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let name = format!("{}.migdra-{}", object.name.as_deref().unwrap_or("unknown"), reason.to_ascii_lowercase());
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let message: String = message.chars().take(1024).collect();
        let result = match api.get_opt(&name).await {
            Ok(Some(mut e)) => {
                e.count = Some(e.count.unwrap_or(1) + 1);
                e.last_timestamp = Some(now);
                e.message = Some(message);
                api.replace(&name, &PostParams::default(), &e).await.map(|_| ())
            }
            Ok(None) => {
                let e = Event {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(namespace.into()),
                        ..Default::default()
                    },
                    involved_object: object,
                    reason: Some(reason.into()),
                    message: Some(message),
                    type_: Some("Warning".into()),
                    count: Some(1),
                    first_timestamp: Some(now.clone()),
                    last_timestamp: Some(now),
                    source: Some(EventSource { component: Some(COMPONENT.into()), host: Some(self.node.clone()) }),
                    reporting_component: Some(COMPONENT.into()),
                    reporting_instance: Some(self.node.clone()),
                    ..Default::default()
                };
                api.create(&PostParams::default(), &e).await.map(|_| ())
            }
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::debug!(event = %name, error = %e, "failed to post an event");
        }
    }
}
