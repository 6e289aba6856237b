//! What the OpenAI endpoints (chat and completions) share: the check that rejects options this
//! release cannot honour, the response `nvext`, and the `created` timestamp.

use std::time::{SystemTime, UNIX_EPOCH};

use kvmesh_llm::openai::SamplingOptions;
use serde_json::Value;

use crate::error::FrontendError;
use crate::generate::ServedBy;

/// Rejects options this server will not honour, instead of ignoring them.
pub(crate) fn check_supported(sampling: &SamplingOptions) -> Result<(), FrontendError> {
    // OpenAI's own limit, a client mistake (400) there too.
    if sampling.n > MAX_CHOICES {
        return Err(FrontendError::invalid(
            format!("n = {} is more than {MAX_CHOICES} choices", sampling.n),
            Some("n"),
        ));
    }
    Ok(())
}

/// Most choices one request may ask for: each is a worker request of its own.
const MAX_CHOICES: u32 = 128;

/// The response `nvext` for the fields the client asked for in `nvext.extra_fields` (none with
/// `DYN_DISABLE_FRONTEND_NVEXT`).
pub(crate) fn response_nvext(
    settings: &super::HttpSettings,
    request_nvext: &Option<Value>,
    worker_id: u64,
    dp_rank: u32,
) -> Option<Value> {
    wants_worker_nvext(settings, request_nvext)
        .then(|| worker_nvext(ServedBy { worker_id, dp_rank }))
}

/// Whether the client asked for the serving worker in the response (`nvext.extra_fields`
/// naming `worker_id`, and nvext not disabled).
pub(crate) fn wants_worker_nvext(
    settings: &super::HttpSettings,
    request_nvext: &Option<Value>,
) -> bool {
    request_nvext
        .as_ref()
        .filter(|_| !settings.disable_nvext)
        .and_then(|nvext| nvext.get("extra_fields"))
        .and_then(Value::as_array)
        .is_some_and(|fields| fields.iter().any(|f| f.as_str() == Some("worker_id")))
}

/// The response `nvext` naming the worker that served the request (aggregated serving: one
/// worker does prefill and decode).
pub(crate) fn worker_nvext(served_by: ServedBy) -> Value {
    serde_json::json!({"worker_id": {
        "prefill_worker_id": served_by.worker_id,
        "prefill_dp_rank": served_by.dp_rank,
        "decode_worker_id": served_by.worker_id,
        "decode_dp_rank": served_by.dp_rank,
    }})
}

/// Seconds since the Unix epoch for `created` fields.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
