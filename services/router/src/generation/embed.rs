//! Embeddings through the seam: no routing decision, one worker chosen by the request id.

use kvmesh_proto::v1::{EmbedRequest, EmbedResponse};
use kvmesh_routing::error::RouteError;

use super::{MAX_START_ATTEMPTS, ModelRouter, is_unreachable, worker_failure};

impl ModelRouter {
    /// Embeds `request` on one of the model's workers: `pinned` when given (a pin to a worker
    /// not serving the model finds none), else the one the request id hashes to, since
    /// embeddings hold no KV cache worth routing for (requests spread evenly without shared
    /// state); an unreachable worker passes the request to the next.
    pub async fn embed(
        &self,
        request: EmbedRequest,
        pinned: Option<u64>,
    ) -> Result<EmbedResponse, RouteError> {
        let pinned_worker;
        let workers = match pinned {
            None => self.workers(),
            Some(id) => {
                pinned_worker = self
                    .workers()
                    .iter()
                    .filter(|worker| worker.id == id)
                    .cloned()
                    .collect::<Vec<_>>();
                &pinned_worker
            }
        };
        if workers.is_empty() {
            return Err(RouteError::NoEndpoint);
        }
        let first = xxhash_rust::xxh3::xxh3_64(request.request_id.as_bytes()) as usize;
        let mut last = RouteError::NoEndpoint;
        for attempt in 0..workers.len().min(MAX_START_ATTEMPTS) {
            let worker = &workers[(first + attempt) % workers.len()];
            match worker.endpoint.embed(request.clone()).await {
                Ok(response) => return Ok(response),
                Err(status) => {
                    let error = worker_failure(status);
                    if !is_unreachable(&error) {
                        return Err(error);
                    }
                    last = error;
                }
            }
        }
        Err(last)
    }
}
