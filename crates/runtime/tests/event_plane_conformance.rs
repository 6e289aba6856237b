//! Runs the event plane conformance suite against the in-process plane and a real NATS server
//! from `NATS_SERVER`. Without `NATS_SERVER` the NATS tests fail, unless
//! `KVMESH_SKIP_EXTERNAL=1` says to skip them.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use kvmesh_runtime::Result;
use kvmesh_runtime::event_plane::EventPlane;
use kvmesh_runtime::event_plane::conformance::{self as suite, Scope};
use kvmesh_runtime::event_plane::mem::MemEventPlane;
use kvmesh_runtime::event_plane::nats::NatsEventPlane;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Open = Box<dyn Fn() -> BoxFuture<Result<Arc<dyn EventPlane>>> + Send + Sync>;

/// The NATS server URL, `None` to skip, or a panic when NATS is required but not configured.
fn nats_server() -> Option<String> {
    match std::env::var("NATS_SERVER") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ if std::env::var("KVMESH_SKIP_EXTERNAL").as_deref() == Ok("1") => {
            eprintln!("skipping NATS test: NATS_SERVER not set and KVMESH_SKIP_EXTERNAL=1");
            None
        }
        _ => panic!(
            "NATS_SERVER is not set: the NATS conformance tests need a real nats-server with \
             JetStream (e.g. NATS_SERVER=nats://127.0.0.1:4222), or set KVMESH_SKIP_EXTERNAL=1 \
             to skip them"
        ),
    }
}

/// A plane handle per call, all on one in-process bus.
fn mem_open() -> Option<Open> {
    let bus = MemEventPlane::new();
    Some(Box::new(move || {
        let plane: Arc<dyn EventPlane> = Arc::new(bus.clone());
        Box::pin(async move { Ok(plane) })
    }))
}

/// A new connection per call, as separate processes would have.
fn nats_open() -> Option<Open> {
    let server = nats_server()?;
    Some(Box::new(move || {
        let server = server.clone();
        Box::pin(async move {
            let plane: Arc<dyn EventPlane> = Arc::new(NatsEventPlane::connect(&server).await?);
            Ok(plane)
        })
    }))
}

/// Deletes the test's stream on a real server so reruns do not pile streams up.
async fn cleanup(scope: &Scope) -> Result<()> {
    if let Some(server) = nats_server() {
        NatsEventPlane::connect(&server)
            .await?
            .delete_stream(&scope.stream)
            .await?;
    }
    Ok(())
}

macro_rules! event_plane_suite {
    ($backend:ident, $open:ident, [$($case:ident),* $(,)?]) => {
        mod $backend {
            use super::*;

            $(
                #[tokio::test]
                async fn $case() -> Result<()> {
                    let Some(open) = $open() else { return Ok(()) };
                    let scope = Scope::unique(stringify!($case));
                    suite::$case(open, &scope).await?;
                    if stringify!($backend) == "nats" {
                        cleanup(&scope).await?;
                    }
                    Ok(())
                }
            )*
        }
    };
}

event_plane_suite!(
    mem,
    mem_open,
    [
        wildcard_matching,
        fan_out_to_two_subscribers,
        durable_ordering,
        dedup_by_msg_id,
        consume_from_middle,
        consume_follows_live,
        filters,
        missing_stream_is_an_error,
    ]
);

event_plane_suite!(
    nats,
    nats_open,
    [
        wildcard_matching,
        fan_out_to_two_subscribers,
        durable_ordering,
        dedup_by_msg_id,
        consume_from_middle,
        consume_follows_live,
        filters,
        missing_stream_is_an_error,
    ]
);
