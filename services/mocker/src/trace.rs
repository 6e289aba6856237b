//! The worker's span of a generation (docs/tracing.md): a child of the caller's span from the
//! call's trace context, with the time to the first token as an event and an attribute.

use std::time::Instant;

use futures::StreamExt;
use kvmesh_proto::v1::GenerateRequest;
use kvmesh_runtime::otel::{KeyValue, SpanKind, Trace};
use kvmesh_runtime::worker_client::ResponseStream;

/// The span of `request` under `parent`; off when `parent` is.
pub fn span(parent: &Trace, request: &GenerateRequest) -> Trace {
    let span = parent.child("worker_generate", SpanKind::Server);
    span.set_with(|| {
        vec![
            KeyValue::new("kvmesh.request_id", request.request_id.clone()),
            KeyValue::new("kvmesh.prompt_tokens", request.token_ids.len() as i64),
            KeyValue::new(
                "kvmesh.migrations",
                request
                    .migration
                    .as_ref()
                    .map_or(0, |m| i64::from(m.num_migrations)),
            ),
        ]
    });
    span
}

/// `stream` recorded on `span`: the first token's event and TTFT, the worker, the output
/// length and an error finish; the span ends with the stream (a dropped stream included).
/// Returns `stream` untouched when `span` is off.
pub fn traced(stream: ResponseStream, span: Trace) -> ResponseStream {
    if !span.is_active() {
        return stream;
    }
    let started = Instant::now();
    let mut num_tokens = 0usize;
    stream
        .map(move |item| {
            if let Ok(response) = &item {
                if num_tokens == 0 && !response.token_ids.is_empty() {
                    span.event("first_token");
                    span.set("kvmesh.ttft_ms", started.elapsed().as_secs_f64() * 1000.0);
                }
                if let Some(worker) = &response.worker {
                    span.set("kvmesh.worker_id", format!("{:x}", worker.worker_id));
                    span.set("kvmesh.dp_rank", i64::from(worker.dp_rank));
                }
                num_tokens += response.token_ids.len();
                if response.finish_reason != 0 {
                    span.set("kvmesh.output_tokens", num_tokens as i64);
                    if !response.error.is_empty() {
                        span.fail(&response.error);
                    }
                    span.end();
                }
            }
            item
        })
        .boxed()
}
