//! One routing decision against a model's router and its index: hash the prompt, read the
//! overlap from the indexer shards when the decision needs it, then score and track. Shared by
//! the frontend's in-process routers and the `kvmesh-router` service so both decide alike.

use kvmesh_indexer::client::IndexerClient;

use kvmesh_routing::error::RouteError;
use kvmesh_routing::request::RouteRequest;
use kvmesh_routing::shared::{RouteGuard, SharedRouter};

/// Routes `request` with `router`, reading overlap from `indexer` (remote shards) when one is
/// given and the decision needs it; otherwise the router's attached source, if any, is used.
/// Waits in the queue when the request parks; dropping the future leaves the queue.
pub async fn route_with_index(
    router: &SharedRouter,
    indexer: Option<&IndexerClient>,
    request: &RouteRequest<'_>,
) -> Result<RouteGuard, RouteError> {
    let hashing = std::time::Instant::now();
    let prepared = router.prepare(request);
    let hash_time = hashing.elapsed();
    let primary = match indexer {
        Some(indexer) if router.needs_overlap(&prepared) => Some(
            indexer
                .find_matches(router.model(), &prepared.local_hashes)
                .await
                .scores,
        ),
        _ => None,
    };
    let guard = router.route_prepared(prepared, primary).await?;
    Ok(guard.with_hash_time(hash_time))
}
