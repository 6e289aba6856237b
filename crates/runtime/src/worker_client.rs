//! How a caller (frontend, router, processor host) reaches a worker's `Generate`, whatever the
//! transport: gRPC for a worker in another process, a direct call for a worker embedded in this
//! process (`kvmesh up`). Both sit behind [`WorkerEndpoint`].

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use kvmesh_proto::v1::worker_client::WorkerClient;
use kvmesh_proto::v1::{EmbedRequest, EmbedResponse, GenerateRequest, GenerateResponse};

use crate::GrpcErrorCode as _;

/// The stream of responses of one generation. Dropping it cancels the request on the worker.
pub type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<GenerateResponse, tonic::Status>> + Send>>;

/// Something that can run a generation: a remote worker over gRPC or an embedded engine.
#[async_trait]
pub trait WorkerEndpoint: Send + Sync + 'static {
    /// Starts a generation and returns its response stream.
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, tonic::Status>;

    /// [`WorkerEndpoint::generate`] as a step of `trace`: a remote worker gets the trace context
    /// in its request metadata, so that its span joins the caller's trace.
    async fn generate_traced(
        &self,
        request: GenerateRequest,
        _trace: &crate::otel::Trace,
    ) -> Result<ResponseStream, tonic::Status> {
        self.generate(request).await
    }

    /// Embeds tokenized inputs; an engine without embeddings answers `UNIMPLEMENTED`.
    async fn embed(&self, _request: EmbedRequest) -> Result<EmbedResponse, tonic::Status> {
        Err(crate::ErrorCode::NotImplemented.to_status("this worker serves no embeddings"))
    }
}

/// Address scheme of workers embedded in this process.
pub const INPROC_SCHEME: &str = "inproc://";

/// Transport name of embedded workers in `InstanceRecord.transport`.
pub const INPROC_TRANSPORT: &str = "inproc";

fn inproc_table() -> &'static RwLock<HashMap<String, Arc<dyn WorkerEndpoint>>> {
    static TABLE: OnceLock<RwLock<HashMap<String, Arc<dyn WorkerEndpoint>>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

/// Makes an embedded worker reachable at `inproc://{name}` for callers in this process.
pub fn register_inproc(name: &str, endpoint: Arc<dyn WorkerEndpoint>) -> String {
    let address = format!("{INPROC_SCHEME}{name}");
    if let Ok(mut table) = inproc_table().write() {
        table.insert(address.clone(), endpoint);
    }
    address
}

/// Removes an embedded worker.
pub fn unregister_inproc(address: &str) {
    if let Ok(mut table) = inproc_table().write() {
        table.remove(address);
    }
}

/// Settings of gRPC connections to workers.
#[derive(Debug, Clone)]
pub struct GrpcSettings {
    /// Time allowed to establish a connection.
    pub connect_timeout: Duration,
    /// Time a worker may take to accept a generate call (answer its headers); past it the
    /// worker counts as unreachable, so the request may go to another one.
    pub request_timeout: Duration,
    /// HTTP/2 initial connection window; `None` keeps [`crate::net::CONNECTION_WINDOW`].
    pub connection_window: Option<u32>,
    /// HTTP/2 initial stream window; `None` keeps [`crate::net::STREAM_WINDOW`].
    pub stream_window: Option<u32>,
    /// Largest message accepted.
    pub max_message_size: usize,
}

impl Default for GrpcSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(10),
            connection_window: None,
            stream_window: None,
            max_message_size: 32 * 1024 * 1024,
        }
    }
}

/// Resolves a worker address to an endpoint: `inproc://` names registered in this process, and
/// `host:port` (or `http://host:port`) for gRPC. gRPC channels connect lazily and reconnect.
pub fn connect_worker(
    address: &str,
    settings: &GrpcSettings,
) -> Result<Arc<dyn WorkerEndpoint>, tonic::Status> {
    if address.starts_with(INPROC_SCHEME) {
        return inproc_table()
            .read()
            .ok()
            .and_then(|table| table.get(address).cloned())
            .ok_or_else(|| {
                crate::ErrorCode::Unavailable.to_status(format!("no embedded worker {address}"))
            });
    }
    let mut endpoint =
        crate::net::mesh_endpoint(address, settings.connect_timeout).map_err(|e| {
            crate::ErrorCode::InvalidArgument.to_status(format!("worker address {address}: {e}"))
        })?;
    if let Some(window) = settings.connection_window {
        endpoint = endpoint.initial_connection_window_size(window);
    }
    if let Some(window) = settings.stream_window {
        endpoint = endpoint.initial_stream_window_size(window);
    }
    let client = WorkerClient::new(endpoint.connect_lazy())
        .max_decoding_message_size(settings.max_message_size)
        .max_encoding_message_size(settings.max_message_size);
    Ok(Arc::new(GrpcWorker {
        client,
        request_timeout: settings.request_timeout,
        max_message_size: settings.max_message_size,
    }))
}

/// A worker in another process, reached over gRPC.
#[derive(Clone)]
pub struct GrpcWorker {
    client: WorkerClient<tonic::transport::Channel>,
    request_timeout: Duration,
    max_message_size: usize,
}

impl GrpcWorker {
    /// A request too large for `DYN_TCP_MAX_MESSAGE_SIZE` is refused here with a status that
    /// says so; sent, it would only break its HTTP/2 stream. The exact size is computed only
    /// when the token ids alone could come near the limit.
    fn check_size(&self, request: &GenerateRequest) -> Result<(), tonic::Status> {
        const MAX_VARINT_BYTES: usize = 5;
        if request.token_ids.len() * MAX_VARINT_BYTES < self.max_message_size / 2 {
            return Ok(());
        }
        let size = prost::Message::encoded_len(request);
        if size <= self.max_message_size {
            return Ok(());
        }
        Err(crate::ErrorCode::PayloadTooLarge.to_status(format!(
            "the worker request is {size} bytes, over the internal message limit of {} bytes (DYN_TCP_MAX_MESSAGE_SIZE)",
            self.max_message_size
        )))
    }
}

#[async_trait]
impl WorkerEndpoint for GrpcWorker {
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, tonic::Status> {
        self.generate_traced(request, &crate::otel::Trace::off())
            .await
    }

    async fn generate_traced(
        &self,
        request: GenerateRequest,
        trace: &crate::otel::Trace,
    ) -> Result<ResponseStream, tonic::Status> {
        self.check_size(&request)?;
        let mut client = self.client.clone();
        let mut request = tonic::Request::new(request);
        trace.inject_metadata(request.metadata_mut());
        let response = tokio::time::timeout(self.request_timeout, client.generate(request))
            .await
            .map_err(|_| {
                crate::ErrorCode::Unavailable.to_status(format!(
                    "worker did not accept the request within {:?} (DYN_TCP_REQUEST_TIMEOUT)",
                    self.request_timeout
                ))
            })?
            .map_err(connection_failure_is_unavailable)?;
        Ok(drained(response.into_inner()))
    }

    async fn embed(&self, request: EmbedRequest) -> Result<EmbedResponse, tonic::Status> {
        let mut client = self.client.clone();
        client
            .embed(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(connection_failure_is_unavailable)
    }
}

/// A status this side made because the connection failed (reset, refused mid-handshake, closed
/// by a dying worker: "operation was canceled") says `Unknown`, `Internal` or `Cancelled` with the
/// transport error as its source; a status the worker sent has no source, and this side cancels
/// only by dropping the stream, which yields no status. The first kind means the worker could not
/// be reached, so callers may safely try another worker: nothing reached the client yet.
fn connection_failure_is_unavailable(status: tonic::Status) -> tonic::Status {
    let is_local = std::error::Error::source(&status).is_some();
    let is_transport = matches!(
        status.code(),
        tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
    );
    if is_local && is_transport {
        return crate::ErrorCode::Unavailable
            .to_status(format!("worker connection failed: {}", status.message()));
    }
    status
}

/// Responses a slow caller may fall behind by before new ones are merged into the last.
const MAX_UNMERGED_RESPONSES: usize = 32;

/// A worker's response stream, read as fast as the worker sends it.
///
/// One HTTP/2 connection carries every stream to a worker, and the h2 crate tears the whole
/// connection down (GOAWAY `ENHANCE_YOUR_CALM`, "too_many_data_frames") once too many small DATA
/// frames sit unread in its buffers. Token responses are small, so a caller that reads slowly
/// (a client that stops reading its SSE stream, a burst of migrated requests on a busy frontend)
/// would otherwise fail every other request on that worker. A task per stream takes each
/// response off the connection as soon as it arrives and queues it for the caller; past
/// [`MAX_UNMERGED_RESPONSES`] waiting, new ones are merged into the last, so a caller that stops
/// reading costs a few bytes per token and nothing is held in h2. A caller that keeps up sees
/// the worker's responses exactly as sent. Dropping the returned stream ends the task, which
/// cancels the request on the worker.
pub fn drained(mut inner: tonic::Streaming<GenerateResponse>) -> ResponseStream {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        let mut pending: VecDeque<GenerateResponse> = VecDeque::new();
        // `None` while the worker still sends; then its end, clean or with a status.
        let mut end: Option<Option<tonic::Status>> = None;
        loop {
            if pending.is_empty()
                && let Some(end) = end.take()
            {
                if let Some(status) = end {
                    let _ = tx.send(Err(status)).await;
                }
                return;
            }
            tokio::select! {
                biased;
                next = inner.message(), if end.is_none() => match next {
                    Ok(Some(response)) => {
                        let is_full = pending.len() >= MAX_UNMERGED_RESPONSES;
                        match pending.back_mut() {
                            Some(last) if is_full => merge_response(last, response),
                            _ => pending.push_back(response),
                        }
                    }
                    Ok(None) => end = Some(None),
                    Err(status) => end = Some(Some(connection_failure_is_unavailable(status))),
                },
                permit = tx.reserve(), if !pending.is_empty() => {
                    let Ok(permit) = permit else { return };
                    if let Some(response) = pending.pop_front() {
                        permit.send(Ok(response));
                    }
                }
                _ = tx.closed(), if pending.is_empty() => return,
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx).boxed()
}

/// Appends `next` to a response the caller has not taken yet: tokens, text and log
/// probabilities in order; the finish, usage, error and stop token of the latest; the worker
/// identity of the first.
fn merge_response(merged: &mut GenerateResponse, next: GenerateResponse) {
    merged.token_ids.extend(next.token_ids);
    merged.logprobs.extend(next.logprobs);
    if let Some(text) = next.text {
        merged.text.get_or_insert_default().push_str(&text);
    }
    if next.finish_reason != 0 {
        merged.finish_reason = next.finish_reason;
    }
    if next.usage.is_some() {
        merged.usage = next.usage;
    }
    if merged.worker.is_none() {
        merged.worker = next.worker;
    }
    if !next.error.is_empty() {
        merged.error = next.error;
    }
    if next.matched_stop_token_id.is_some() {
        merged.matched_stop_token_id = next.matched_stop_token_id;
    }
}
