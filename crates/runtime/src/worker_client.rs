//! How a caller (frontend, router, processor host) reaches a worker's `Generate`, whatever the
//! transport: gRPC for a worker in another process, a direct call for a worker embedded in this
//! process (`kvmesh up`). Both sit behind [`WorkerEndpoint`].

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::{Stream, StreamExt};
use kvmesh_proto::v1::worker_client::WorkerClient;
use kvmesh_proto::v1::{GenerateRequest, GenerateResponse};

/// The stream of responses of one generation. Dropping it cancels the request on the worker.
pub type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<GenerateResponse, tonic::Status>> + Send>>;

/// Something that can run a generation: a remote worker over gRPC or an embedded engine.
#[async_trait]
pub trait WorkerEndpoint: Send + Sync + 'static {
    /// Starts a generation and returns its response stream.
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, tonic::Status>;
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
    /// HTTP/2 initial connection window.
    pub connection_window: Option<u32>,
    /// HTTP/2 initial stream window.
    pub stream_window: Option<u32>,
    /// Largest message accepted.
    pub max_message_size: usize,
}

impl Default for GrpcSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(3),
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
            .ok_or_else(|| tonic::Status::unavailable(format!("no embedded worker {address}")));
    }
    let mut endpoint = crate::net::mesh_endpoint(address, settings.connect_timeout)
        .map_err(|e| tonic::Status::invalid_argument(format!("worker address {address}: {e}")))?
        .http2_adaptive_window(settings.connection_window.is_none());
    if let Some(window) = settings.connection_window {
        endpoint = endpoint.initial_connection_window_size(window);
    }
    if let Some(window) = settings.stream_window {
        endpoint = endpoint.initial_stream_window_size(window);
    }
    let client = WorkerClient::new(endpoint.connect_lazy())
        .max_decoding_message_size(settings.max_message_size)
        .max_encoding_message_size(settings.max_message_size);
    Ok(Arc::new(GrpcWorker { client }))
}

/// A worker in another process, reached over gRPC.
#[derive(Clone)]
pub struct GrpcWorker {
    client: WorkerClient<tonic::transport::Channel>,
}

#[async_trait]
impl WorkerEndpoint for GrpcWorker {
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, tonic::Status> {
        let mut client = self.client.clone();
        let response = client.generate(request).await?;
        Ok(response.into_inner().boxed())
    }
}
