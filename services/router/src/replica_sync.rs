//! Replica sync over the event plane (docs/routing.md, "Replica sync"): every router replica of a
//! model publishes its tracker changes on `kvmesh.{ns}.router.{model}` and applies the other
//! replicas' changes, so each one sees the load the others put on the workers.
//!
//! Best effort by design: a lost event leaves a stale entry that expiry removes, and nothing
//! here blocks routing (changes leave through a bounded channel that drops when full).

use std::sync::Arc;

use futures::StreamExt;
use kvmesh_runtime::event_plane::EventPlane;
use kvmesh_runtime::names;
use prost::Message as _;
use tokio_util::sync::CancellationToken;

use crate::wire;
use kvmesh_routing::shared::SharedRouter;

/// Changes that may wait for the publisher before new ones are dropped.
const SYNC_CHANNEL_CAPACITY: usize = 65_536;

/// Starts publishing `router`'s tracker changes and applying the other replicas' until
/// `shutdown`. The subscription is in place before this returns, so no change published after it
/// is missed. Fails when the router already has a sync sink or the subscription fails.
pub async fn start(
    events: Arc<dyn EventPlane>,
    namespace: &str,
    router: SharedRouter,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let subject = names::router_subject(namespace, router.model());
    let mut subscription = events.subscribe(&subject).await?;
    let Some(mut outgoing) = router.attach_sync_sink(SYNC_CHANNEL_CAPACITY) else {
        anyhow::bail!(
            "router for {} already publishes its sync events",
            router.model()
        );
    };
    let own_id = router.router_id();
    {
        let router = router.clone();
        let shutdown = shutdown.clone();
        let subject = subject.clone();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    message = subscription.next() => message,
                };
                let Some(message) = message else {
                    tracing::warn!(%subject, "router sync subscription ended");
                    return;
                };
                match kvmesh_proto::v1::RouterSyncEvent::decode(message.payload) {
                    // Own events come back from NATS; a report another replica passed on does not.
                    Ok(event) if event.router_id != own_id || !event.forwarded_by.is_empty() => {
                        if let Some(event) = wire::sync_from_proto(event) {
                            router.apply_sync_event(&event);
                        }
                    }
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(%subject, %error, "undecodable router sync event")
                    }
                }
            }
        });
    }
    tokio::spawn(async move {
        loop {
            let event = tokio::select! {
                _ = shutdown.cancelled() => return,
                event = outgoing.recv() => event,
            };
            let Some(event) = event else { return };
            let payload = wire::sync_to_proto(&event).encode_to_vec();
            if let Err(error) = events.publish(&subject, payload.into()).await {
                tracing::debug!(%subject, %error, "router sync publish failed");
            }
        }
    });
    Ok(())
}
