//! One generate call of a processor request: run through the model's routing seam, its worker
//! output relayed to the host, its tokens counted for the request's usage.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use kvmesh_proto::v1::{
    CallOutput, ChunkMetrics, GenerateCall, ProcessError, ProcessUp, call_output, process_up,
};
use kvmesh_router::FirstResponseWait;
use kvmesh_routing::RoutingHints;
use kvmesh_runtime::otel::Trace;
use tokio::sync::mpsc;

use crate::error::FrontendError;
use crate::generate::{ServedBy, TokenUsage};
use crate::models::ModelEntry;

/// Token counts of the request's calls, kept by the call pumps, and the worker of the first call
/// that was routed (the one a response's `nvext` names).
#[derive(Default)]
pub(super) struct Totals {
    prompt: AtomicU32,
    completion: AtomicU32,
    cached: AtomicU32,
    pub(super) first_worker: OnceLock<ServedBy>,
}

impl Totals {
    /// The usage: what the processor reported wins over the frontend's own counts.
    pub(super) fn usage(
        &self,
        reported: &ChunkMetrics,
        chunk_usage: Option<TokenUsage>,
    ) -> TokenUsage {
        if let Some(usage) = chunk_usage {
            return usage;
        }
        TokenUsage {
            prompt_tokens: reported
                .input_tokens
                .unwrap_or_else(|| self.prompt.load(Ordering::Relaxed)),
            completion_tokens: reported
                .output_tokens
                .unwrap_or_else(|| self.completion.load(Ordering::Relaxed)),
            cached_tokens: reported
                .cached_tokens
                .unwrap_or_else(|| self.cached.load(Ordering::Relaxed)),
        }
    }
}

/// Runs one generate call through the seam and relays its output to the host.
pub(super) async fn pump_call(
    entry: Arc<ModelEntry>,
    call: GenerateCall,
    hints: RoutingHints,
    response_timeout: Option<Duration>,
    span: Trace,
    up: mpsc::Sender<ProcessUp>,
    totals: Arc<Totals>,
) {
    let call_id = call.call_id;
    let send = |kind: call_output::Kind| {
        let up = up.clone();
        async move {
            let message = ProcessUp {
                kind: Some(process_up::Kind::Output(CallOutput {
                    call_id,
                    kind: Some(kind),
                })),
            };
            up.send(message).await.is_ok()
        }
    };
    let failed = |error: FrontendError| {
        call_output::Kind::Error(ProcessError {
            error_code: error.code().name().to_owned(),
            http_status: 0,
            message: error.public_message(),
        })
    };
    let Some(request) = call.request else {
        send(failed(FrontendError::invalid(
            "a generate call without a request",
            None,
        )))
        .await;
        return;
    };
    totals
        .prompt
        .fetch_add(request.token_ids.len() as u32, Ordering::Relaxed);
    let options = crate::generate::GenerateOptions {
        hints,
        prefix_cuts: Vec::new().into(),
        response_timeout,
        wait: FirstResponseWait::None,
        trace: span,
    };
    let started = crate::generate::start(&entry, request, options).await;
    let mut generation = match started {
        Ok(generation) => generation,
        Err(error) => {
            send(failed(error)).await;
            return;
        }
    };
    // Set before any of this call's output reaches the host, so before any text made from it.
    let _ = totals.first_worker.set(ServedBy {
        worker_id: generation.worker_id(),
        dp_rank: generation.dp_rank(),
    });
    while let Some(item) = generation.next().await {
        match item {
            Ok(response) => {
                totals
                    .completion
                    .fetch_add(response.token_ids.len() as u32, Ordering::Relaxed);
                if let Some(usage) = &response.usage {
                    totals.cached.store(usage.cached_tokens, Ordering::Relaxed);
                }
                if !send(call_output::Kind::Response(response)).await {
                    return;
                }
            }
            Err(error) => {
                send(failed(error.into())).await;
                return;
            }
        }
    }
    send(call_output::Kind::End(true)).await;
}
