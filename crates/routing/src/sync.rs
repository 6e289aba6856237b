//! Tracker changes as events, for replica sync (docs/routing.md, "Replica sync").
//!
//! With `--router-replica-sync` the core records every change it makes to its tracker as a
//! [`SyncEvent`] ([`crate::RouterCore::take_sync_events`]); the service publishes them as
//! `RouterSyncEvent` on `kvmesh.{ns}.router.{model}` and feeds what it receives to
//! [`crate::RouterCore::apply_sync_event`]. They mirror Dynamo's `AddRequest`,
//! `MarkPrefillCompleted` and `Free`.

use kvmesh_kv::WorkerKey;

use crate::request::TerminalPath;

/// The discovery instance a router id names: replicas sign their events `{instance_id:x}-{model}`
/// (`kvmesh-router`), so a receiver can release what a departed replica routed. `None` for ids
/// of another shape (a router without a registered instance).
pub fn router_instance(router_id: &str) -> Option<u64> {
    let (hex, _) = router_id.split_once('-')?;
    u64::from_str_radix(hex, 16).ok()
}

/// One tracker change of one router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncEvent {
    /// Router that made the change (receivers ignore their own).
    pub router_id: String,
    /// The request, unique within its router.
    pub request_id: String,
    /// Where the request was routed.
    pub worker: WorkerKey,
    /// What changed.
    pub kind: SyncKind,
    /// The replica that passed on a caller's report for `router_id`'s request; the owner applies
    /// such an event to its own entry.
    pub forwarded_by: Option<String>,
}

/// The change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncKind {
    /// A request was routed to `worker`.
    Add {
        /// Block hashes tracked for it (sequence hashes, or fresh ones without KV reuse).
        token_sequence_hashes: Vec<u64>,
        /// Whether its prefill tokens count.
        track_prefill_tokens: bool,
        /// Expected output length, when the client gave one.
        expected_output_tokens: Option<u32>,
        /// Prefill tokens it adds (uncached prompt tokens).
        initial_prefill_tokens: Option<u64>,
        /// Predicted prefill duration (`aic` load model, `later`).
        expected_prefill_duration_ms: Option<u64>,
        /// LoRA adapter.
        lora_name: Option<String>,
    },
    /// Its first token arrived.
    MarkPrefillCompleted,
    /// It ended, by `path` (expiry included).
    Free {
        /// How it ended.
        path: TerminalPath,
    },
    /// A session is bound to `worker` (after dispatch and again at request end).
    SessionBind {
        /// `X-Dynamo-Session-ID`.
        session_id: String,
    },
}
