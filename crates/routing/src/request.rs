//! What a caller hands the router for one request and what it gets back.

use std::hash::{BuildHasher, RandomState};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kvmesh_core::prefix::PrefixCut;

/// A tracking id for one routing of `request_id` that no other routing shares, in this process or
/// another: router state is keyed by request id, and a client's id is not unique (retries, the
/// same `x-request-id` sent to two frontends that share a router replica). A random per-process
/// tag and a counter follow the client's id, which stays readable in logs.
pub fn unique_route_id(request_id: &str) -> String {
    static PROCESS_TAG: LazyLock<u64> =
        LazyLock::new(|| RandomState::new().hash_one(std::process::id()));
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{request_id}#{:016x}-{}",
        *PROCESS_TAG,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Per-request changes to the cost model (`router_config_override` of the router API and EPP;
/// docs/routing.md, "Cost function"). Unset fields keep the router's value.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct RouterConfigOverride {
    /// Replaces `--router-kv-overlap-score-credit`.
    pub overlap_score_credit: Option<f64>,
    /// Replaces `--router-prefill-load-scale`.
    pub prefill_load_scale: Option<f64>,
    /// Replaces `--router-temperature`.
    pub router_temperature: Option<f64>,
    /// Shared-cache credit (`later`: accepted, no effect until a shared cache exists).
    pub shared_cache_multiplier: Option<f64>,
    /// Replaces `--router-assume-kv-reuse`.
    pub assume_kv_reuse: Option<bool>,
    /// Replaces `--router-track-prefill-tokens`.
    pub track_prefill_tokens: Option<bool>,
    /// Legacy weight, mapped as the deprecated flag is (wins over credit and scale).
    pub overlap_score_weight: Option<f64>,
}

/// Pins, priorities and hints that travel with a request (nvext, headers, routing hints).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RoutingHints {
    /// Worker the request must go to (direct mode; a restriction in other modes).
    pub backend_instance_id: Option<u64>,
    /// Data-parallel rank the request must go to.
    pub dp_rank: Option<u32>,
    /// Only these workers may be chosen (`allowed_worker_ids`).
    pub allowed_worker_ids: Option<Vec<u64>>,
    /// Queue priority, higher first (negative counts as 0).
    pub priority: i32,
    /// Strict priority class: a higher class always leaves the queue first.
    pub strict_priority: u32,
    /// Expected output length (`agent_hints.osl`): decays this request's exclusive blocks.
    pub expected_output_tokens: Option<u32>,
    /// `X-Dynamo-Session-ID`.
    pub session_id: Option<String>,
    /// `nvext.session_control` `bind` timeout: session stickiness for this request even when
    /// `--router-session-affinity-ttl-secs` is unset, with this idle TTL.
    pub session_bind_ttl: Option<Duration>,
    /// Per-request cost-model override.
    pub config_override: Option<RouterConfigOverride>,
    /// Cache salt (the body's `cache_salt` or the `x-tenant-id` header). The routing seam writes
    /// it into the worker request unless that carries its own, and routes on the request's salt.
    pub cache_salt: Option<String>,
    /// The discovery instance that reports this request's life when it is not this process (a
    /// frontend routing through a router replica): when that instance leaves discovery, the
    /// request is released (docs/routing.md, "Load tracking").
    pub caller_instance_id: Option<u64>,
}

/// One request to route.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteRequest<'a> {
    /// Unique among the requests this router tracks (the tracker and sync events key on it).
    pub request_id: String,
    /// Prompt token ids (for migration: prompt plus the tokens already generated).
    pub token_ids: &'a [u32],
    /// LoRA adapter; part of the block-hash seed.
    pub lora_name: Option<&'a str>,
    /// Cache salt (`cache_salt` / `x-tenant-id`); part of the block-hash seed.
    pub cache_salt: Option<&'a str>,
    /// Pins, priorities, session.
    pub hints: RoutingHints,
    /// The prompt's cut points from tokenizing, shortest first: block hashes of a prefix seen
    /// before are reused by its key (empty = hash the whole prompt).
    pub prefix_cuts: &'a [PrefixCut],
}

impl<'a> RouteRequest<'a> {
    /// A request without hints.
    pub fn new(request_id: impl Into<String>, token_ids: &'a [u32]) -> Self {
        Self {
            request_id: request_id.into(),
            token_ids,
            lora_name: None,
            cache_salt: None,
            hints: RoutingHints::default(),
            prefix_cuts: &[],
        }
    }

    /// Sets the hints.
    pub fn with_hints(mut self, hints: RoutingHints) -> Self {
        self.hints = hints;
        self
    }
}

/// Where a request goes (step 6 of docs/routing.md, "KV routing flow").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The request.
    pub request_id: String,
    /// Chosen worker.
    pub worker_id: u64,
    /// Chosen rank: always set in `kv` mode, the pin's otherwise (the engine picks when unset).
    pub dp_rank: Option<u32>,
    /// Prompt blocks the chosen rank is expected to hold (device tier).
    pub overlap_blocks: u32,
    /// `overlap_blocks · block_size`.
    pub cached_tokens: u64,
    /// `ceil(ISL / block_size)`.
    pub required_blocks: u64,
}

/// Identifies a parked request until it leaves the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// Result of routing one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteOutcome {
    /// Routed now; the request is tracked until it is freed.
    Routed(Decision),
    /// Parked (docs/routing.md, "Queue"); its decision arrives later through
    /// [`crate::RouterCore::take_dispatched`].
    Queued(Ticket),
}

/// A parked request that left the queue: routed (and tracked) or failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dispatched {
    /// Ticket returned when it parked.
    pub ticket: Ticket,
    /// The request.
    pub request_id: String,
    /// Its decision, or why it could not be routed after all.
    pub result: Result<Decision, crate::RouteError>,
}

/// How a routed request ended. Every path frees the request's tracked load; they differ only in
/// what happens to its session binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TerminalPath {
    /// The stream finished normally.
    Completed,
    /// The request failed for a reason that says nothing against its worker (a rejected
    /// request, a race with discovery); the session binding is dropped.
    Error,
    /// The worker failed it (unreachable, an internal error, silent past its deadline) and it
    /// was not moved elsewhere: the binding is dropped and the worker's failure counted
    /// (docs/routing.md, "Ejection of failing workers").
    WorkerFailed,
    /// The request was cancelled (by the client API or a stop).
    Cancelled,
    /// The client went away mid-stream (also what a dropped guard reports).
    Disconnected,
    /// The worker failed and the request continues elsewhere (the binding is dropped).
    Migrated,
    /// The tracker presumed the request lost after `DYN_ROUTER_ACTIVE_REQUEST_EXPIRY_SECS`.
    Expired,
}

impl TerminalPath {
    /// Every path a caller can report.
    pub const ALL: [TerminalPath; 6] = [
        TerminalPath::Completed,
        TerminalPath::Error,
        TerminalPath::WorkerFailed,
        TerminalPath::Cancelled,
        TerminalPath::Disconnected,
        TerminalPath::Migrated,
    ];

    /// Whether the request's session binding is dropped (a non-cancellation failure of its
    /// worker; docs/routing.md, "Session affinity") rather than left to its idle timer.
    pub fn drops_session(self) -> bool {
        matches!(
            self,
            TerminalPath::Error | TerminalPath::WorkerFailed | TerminalPath::Migrated
        )
    }

    /// Whether the request's worker failed it (counted towards its ejection).
    pub fn is_worker_failure(self) -> bool {
        matches!(self, TerminalPath::WorkerFailed | TerminalPath::Migrated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_ids_of_one_client_id_never_repeat() {
        let ids: std::collections::HashSet<String> =
            (0..1000).map(|_| unique_route_id("retry-me")).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|id| id.starts_with("retry-me#")));
    }
}
