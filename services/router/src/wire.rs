//! Conversions between the router's types and their protobuf forms (`router.proto`, the
//! `RouterSyncEvent` of `events.proto`), in one place for the service, its client and replica sync.

use std::time::Duration;

use kvmesh_kv::WorkerKey;
use kvmesh_proto::v1 as pb;

use kvmesh_routing::RouteError;
use kvmesh_routing::config::BusyThresholds;
use kvmesh_routing::request::{Decision, RouterConfigOverride, RoutingHints, TerminalPath};
use kvmesh_routing::sync::{SyncEvent, SyncKind};
use kvmesh_routing::worker::WorkerLoad;
use kvmesh_runtime::GrpcErrorCode as _;

/// A worker's published load (`kvmesh.{ns}.load.{model}`) as the core reads it.
pub fn load_from_proto(load: &pb::WorkerLoad) -> WorkerLoad {
    WorkerLoad {
        worker: WorkerKey::new(load.worker_id, load.dp_rank),
        kv_used_blocks: load.kv_used_blocks,
        kv_total_blocks: load.kv_total_blocks,
        num_running: load.num_running,
        num_waiting: load.num_waiting,
        waiting_prefill_tokens: load.waiting_prefill_tokens,
    }
}

/// The protobuf form of a tracker change.
pub fn sync_to_proto(event: &SyncEvent) -> pb::RouterSyncEvent {
    use pb::router_sync_event::Kind;
    let kind = match &event.kind {
        SyncKind::Add {
            token_sequence_hashes,
            track_prefill_tokens,
            expected_output_tokens,
            initial_prefill_tokens,
            expected_prefill_duration_ms,
            lora_name,
        } => Kind::Add(pb::RouterSyncAdd {
            token_sequence_hashes: token_sequence_hashes.clone(),
            track_prefill_tokens: Some(*track_prefill_tokens),
            expected_output_tokens: *expected_output_tokens,
            initial_prefill_tokens: *initial_prefill_tokens,
            expected_prefill_duration_ms: *expected_prefill_duration_ms,
            lora_name: lora_name.clone(),
        }),
        SyncKind::MarkPrefillCompleted => {
            Kind::MarkPrefillCompleted(pb::RouterSyncMarkPrefillCompleted {})
        }
        SyncKind::Free { path } => Kind::Free(pb::RouterSyncFree {
            path: terminal_to_proto(*path).into(),
        }),
        SyncKind::SessionBind { session_id } => Kind::SessionBind(pb::RouterSyncSessionBind {
            session_id: session_id.clone(),
            phase: "aggregated".to_string(),
        }),
    };
    pb::RouterSyncEvent {
        router_id: event.router_id.clone(),
        request_id: event.request_id.clone(),
        worker_id: event.worker.worker_id,
        dp_rank: event.worker.dp_rank,
        kind: Some(kind),
        forwarded_by: event.forwarded_by.clone().unwrap_or_default(),
    }
}

/// A received tracker change; `None` when it carries no change (an unknown or missing kind).
pub fn sync_from_proto(event: pb::RouterSyncEvent) -> Option<SyncEvent> {
    use pb::router_sync_event::Kind;
    let kind = match event.kind? {
        Kind::Add(add) => SyncKind::Add {
            token_sequence_hashes: add.token_sequence_hashes,
            track_prefill_tokens: add.track_prefill_tokens.unwrap_or(true),
            expected_output_tokens: add.expected_output_tokens,
            initial_prefill_tokens: add.initial_prefill_tokens,
            expected_prefill_duration_ms: add.expected_prefill_duration_ms,
            lora_name: add.lora_name,
        },
        Kind::MarkPrefillCompleted(_) => SyncKind::MarkPrefillCompleted,
        Kind::Free(free) => SyncKind::Free {
            path: terminal_from_proto(free.path).unwrap_or(TerminalPath::Completed),
        },
        Kind::SessionBind(bind) => SyncKind::SessionBind {
            session_id: bind.session_id,
        },
    };
    Some(SyncEvent {
        router_id: event.router_id,
        request_id: event.request_id,
        worker: WorkerKey::new(event.worker_id, event.dp_rank),
        kind,
        forwarded_by: (!event.forwarded_by.is_empty()).then_some(event.forwarded_by),
    })
}

/// The protobuf form of a terminal path (expiry is the tracker's own, never reported; it maps
/// to an error).
pub fn terminal_to_proto(path: TerminalPath) -> pb::TerminalPath {
    match path {
        TerminalPath::Completed => pb::TerminalPath::Completed,
        TerminalPath::Error | TerminalPath::Expired => pb::TerminalPath::Error,
        TerminalPath::Cancelled => pb::TerminalPath::Cancelled,
        TerminalPath::Disconnected => pb::TerminalPath::Disconnected,
        TerminalPath::Migrated => pb::TerminalPath::Migrated,
        TerminalPath::WorkerFailed => pb::TerminalPath::WorkerFailed,
    }
}

/// A reported terminal path; `None` for "not terminal" (and unknown values).
pub fn terminal_from_proto(value: i32) -> Option<TerminalPath> {
    match pb::TerminalPath::try_from(value).ok()? {
        pb::TerminalPath::Unspecified => None,
        pb::TerminalPath::Completed => Some(TerminalPath::Completed),
        pb::TerminalPath::Error => Some(TerminalPath::Error),
        pb::TerminalPath::Cancelled => Some(TerminalPath::Cancelled),
        pb::TerminalPath::Disconnected => Some(TerminalPath::Disconnected),
        pb::TerminalPath::Migrated => Some(TerminalPath::Migrated),
        pb::TerminalPath::WorkerFailed => Some(TerminalPath::WorkerFailed),
    }
}

/// The protobuf form of a cost-model override.
pub fn override_to_proto(value: &RouterConfigOverride) -> pb::RouterConfigOverride {
    pb::RouterConfigOverride {
        overlap_score_credit: value.overlap_score_credit,
        prefill_load_scale: value.prefill_load_scale,
        router_temperature: value.router_temperature,
        shared_cache_multiplier: value.shared_cache_multiplier,
        assume_kv_reuse: value.assume_kv_reuse,
        track_prefill_tokens: value.track_prefill_tokens,
        overlap_score_weight: value.overlap_score_weight,
    }
}

/// A received cost-model override.
pub fn override_from_proto(value: &pb::RouterConfigOverride) -> RouterConfigOverride {
    RouterConfigOverride {
        overlap_score_credit: value.overlap_score_credit,
        prefill_load_scale: value.prefill_load_scale,
        router_temperature: value.router_temperature,
        shared_cache_multiplier: value.shared_cache_multiplier,
        assume_kv_reuse: value.assume_kv_reuse,
        track_prefill_tokens: value.track_prefill_tokens,
        overlap_score_weight: value.overlap_score_weight,
    }
}

/// The wire hints of a request (pins, priorities, session) in the `llm.proto` form.
pub fn hints_to_proto(hints: &RoutingHints) -> pb::RoutingHints {
    pb::RoutingHints {
        backend_instance_id: hints.backend_instance_id,
        dp_rank: hints.dp_rank,
        priority: hints.priority,
        strict_priority: hints.strict_priority,
        expected_output_tokens: hints.expected_output_tokens,
        session_id: hints.session_id.clone().unwrap_or_default(),
        ..Default::default()
    }
}

/// Routing hints from their wire parts.
pub fn hints_from_proto(
    hints: Option<&pb::RoutingHints>,
    allowed_worker_ids: &[u64],
    session_bind_ttl_secs: u32,
    config_override: Option<&pb::RouterConfigOverride>,
) -> RoutingHints {
    let hints = hints.cloned().unwrap_or_default();
    RoutingHints {
        backend_instance_id: hints.backend_instance_id,
        dp_rank: hints.dp_rank,
        allowed_worker_ids: (!allowed_worker_ids.is_empty()).then(|| allowed_worker_ids.to_vec()),
        priority: hints.priority,
        strict_priority: hints.strict_priority,
        expected_output_tokens: hints.expected_output_tokens,
        session_id: (!hints.session_id.is_empty()).then_some(hints.session_id),
        session_bind_ttl: (session_bind_ttl_secs > 0)
            .then(|| Duration::from_secs(u64::from(session_bind_ttl_secs))),
        config_override: config_override.map(override_from_proto),
        // The salt travels in the request itself (`cache_salt` of the route or worker request).
        cache_salt: None,
        // The caller travels in the route request (`caller_instance_id`).
        caller_instance_id: None,
    }
}

/// The `Route` answer for a decision.
pub fn decision_to_proto(
    decision: &Decision,
    router_id: &str,
    tracks_output_tokens: bool,
) -> pb::RouteResponse {
    pb::RouteResponse {
        worker_id: decision.worker_id,
        dp_rank: decision.dp_rank,
        overlap_blocks: decision.overlap_blocks,
        cached_tokens: u32::try_from(decision.cached_tokens).unwrap_or(u32::MAX),
        required_blocks: u32::try_from(decision.required_blocks).unwrap_or(u32::MAX),
        router_id: router_id.to_string(),
        tracks_output_tokens,
    }
}

/// A decision received from a router replica.
pub fn decision_from_proto(request_id: &str, response: &pb::RouteResponse) -> Decision {
    Decision {
        request_id: request_id.to_string(),
        worker_id: response.worker_id,
        dp_rank: response.dp_rank,
        overlap_blocks: response.overlap_blocks,
        cached_tokens: u64::from(response.cached_tokens),
        required_blocks: u64::from(response.required_blocks),
    }
}

/// The protobuf form of a model's busy thresholds.
pub fn thresholds_to_proto(model: &str, thresholds: &BusyThresholds) -> pb::BusyThresholds {
    pb::BusyThresholds {
        model: model.to_string(),
        active_decode_blocks_threshold: thresholds.active_decode_blocks_threshold,
        active_prefill_tokens_threshold: thresholds.active_prefill_tokens_threshold,
        active_prefill_tokens_threshold_frac: thresholds.active_prefill_tokens_threshold_frac,
    }
}

/// Busy thresholds from their protobuf form.
pub fn thresholds_from_proto(value: &pb::BusyThresholds) -> BusyThresholds {
    BusyThresholds {
        active_decode_blocks_threshold: value.active_decode_blocks_threshold,
        active_prefill_tokens_threshold: value.active_prefill_tokens_threshold,
        active_prefill_tokens_threshold_frac: value.active_prefill_tokens_threshold_frac,
    }
}

/// A failed route of a `RouteStream` as the stream carries it: the status's code, message, and
/// the error code and reason from its metadata.
pub fn failure_to_proto(status: &tonic::Status) -> pb::RouteFailure {
    pb::RouteFailure {
        code: status.code() as i32,
        message: status.message().to_string(),
        error_code: kvmesh_runtime::ErrorCode::of_status(status)
            .name()
            .to_string(),
        reason: kvmesh_runtime::error::status_reason(status)
            .unwrap_or_default()
            .to_string(),
    }
}

/// The status a `RouteStream` failure stands for, metadata included, as a unary `Route` call
/// would have returned it (the inverse of [`failure_to_proto`]).
#[allow(
    clippy::disallowed_methods,
    reason = "rebuilds a status an ErrorCode made"
)]
pub fn failure_from_proto(failure: pb::RouteFailure) -> tonic::Status {
    let mut metadata = tonic::metadata::MetadataMap::new();
    for (key, value) in [
        (kvmesh_runtime::error::ERROR_CODE_KEY, &failure.error_code),
        (kvmesh_runtime::error::ERROR_REASON_KEY, &failure.reason),
    ] {
        if !value.is_empty()
            && let Ok(value) = value.parse()
        {
            metadata.insert(key, value);
        }
    }
    tonic::Status::with_metadata(tonic::Code::from(failure.code), failure.message, metadata)
}

/// A [`RouteError`] as a gRPC status and back: the router's API code and message, with the
/// error code and the routing reason in the metadata, so the receiver never reads the message.
pub trait RouteErrorStatus: Sized {
    /// The gRPC status the router service answers with.
    fn to_status(&self) -> tonic::Status;

    /// The routing failure a router replica's status stands for (the inverse of
    /// [`Self::to_status`]); `None` when the replica itself failed (no routing reason: a
    /// transport error, a replica stopping), so the caller should try another replica. `model`
    /// is the model the call was about.
    fn from_status(status: &tonic::Status, model: &str) -> Option<Self>;
}

impl RouteErrorStatus for RouteError {
    fn to_status(&self) -> tonic::Status {
        self.api_code()
            .to_status_with_reason(self.api_message(), Some(self.reason()))
    }

    fn from_status(status: &tonic::Status, model: &str) -> Option<Self> {
        let reason = kvmesh_runtime::error::status_reason(status)?;
        RouteError::from_reason(
            reason,
            kvmesh_runtime::ErrorCode::of_status(status),
            status.message(),
            model,
        )
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
