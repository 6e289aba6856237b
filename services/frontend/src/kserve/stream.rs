//! `ModelStreamInfer` with the requests of one stream running concurrently (docs/kserve.md,
//! "Streams"): each request is a task of the stream's driver; its responses carry its `id` and
//! keep their order; a failure is an `error_message` response and the stream goes on; at most
//! `concurrency` requests run, and the stream is read no further until one ends; when the client
//! goes away every running request is dropped, which cancels it on its worker.

use std::sync::Arc;

use futures::{Stream, StreamExt};
use kvmesh_proto::inference::{ModelInferRequest, ModelInferResponse, ModelStreamInferResponse};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::Status;

use super::infer::{self, STREAM_ENDPOINT};
use crate::error::FrontendError;
use crate::http::AppState;

/// Responses buffered per stream before running requests wait for the client to read.
const RESPONSE_BUFFER: usize = 64;

type Sender = mpsc::Sender<Result<ModelStreamInferResponse, Status>>;

/// Serves one stream: returns its response stream and runs the driver as a task that ends when
/// the requests are all answered and the client closed its side, or when the client goes away.
pub fn serve(
    state: Arc<AppState>,
    requests: impl Stream<Item = Result<ModelInferRequest, Status>> + Send + Unpin + 'static,
    concurrency: usize,
) -> tokio_stream::wrappers::ReceiverStream<Result<ModelStreamInferResponse, Status>> {
    let (sender, receiver) = mpsc::channel(RESPONSE_BUFFER);
    tokio::spawn(drive(state, requests, concurrency, sender));
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

async fn drive(
    state: Arc<AppState>,
    mut requests: impl Stream<Item = Result<ModelInferRequest, Status>> + Send + Unpin,
    concurrency: usize,
    sender: Sender,
) {
    // Dropping the set aborts every running request, which drops its generation.
    let mut running = JoinSet::new();
    let mut is_reading = true;
    while is_reading || !running.is_empty() {
        tokio::select! {
            () = sender.closed() => return,
            Some(_) = running.join_next(), if !running.is_empty() => {}
            next = requests.next(), if is_reading && running.len() < concurrency => match next {
                Some(Ok(request)) => {
                    running.spawn(answer(state.clone(), request, sender.clone()));
                }
                Some(Err(status)) => {
                    // A message that does not decode, or the client's transport failing: the
                    // RPC ends with that status.
                    let _ = sender.send(Err(status)).await;
                    return;
                }
                None => is_reading = false,
            },
        }
    }
}

/// Runs one request of the stream, sending its responses (or its failure) in order.
async fn answer(state: Arc<AppState>, request: ModelInferRequest, sender: Sender) {
    let model_name = request.model_name.clone();
    let id = request.id.clone();
    let failed = |error: FrontendError| ModelStreamInferResponse {
        error_message: error.to_status().message().to_string(),
        infer_response: Some(ModelInferResponse {
            model_name: model_name.clone(),
            id: id.clone(),
            ..ModelInferResponse::default()
        }),
    };
    let prepared = match infer::prepare(&state, request, STREAM_ENDPOINT, true) {
        Ok(prepared) => prepared,
        Err(error) => {
            let _ = sender.send(Ok(failed(error))).await;
            return;
        }
    };
    if !prepared.is_streaming() {
        let response = match infer::unary(&state, prepared, STREAM_ENDPOINT).await {
            Ok(response) => ModelStreamInferResponse {
                error_message: String::new(),
                infer_response: Some(response),
            },
            Err(error) => failed(error),
        };
        let _ = sender.send(Ok(response)).await;
        return;
    }
    let mut responses = std::pin::pin!(infer::streamed(state, prepared, STREAM_ENDPOINT));
    while let Some(response) = responses.next().await {
        let message = match response {
            Ok(response) => ModelStreamInferResponse {
                error_message: String::new(),
                infer_response: Some(response),
            },
            Err(error) => failed(error),
        };
        if sender.send(Ok(message)).await.is_err() {
            return;
        }
    }
}
