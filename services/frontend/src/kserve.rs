//! The KServe v2 gRPC edge (docs/kserve.md): `inference.GRPCInferenceService` over the same
//! model table and the same completions path as the HTTP edge. [`tensors`] maps tensors to a
//! completion and back, `infer` runs one request, `stream` multiplexes `ModelStreamInfer`, and
//! `service` answers the RPCs.

mod infer;
mod service;
mod stream;
pub mod tensors;

use std::sync::Arc;

use kvmesh_proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use kvmesh_runtime::lifecycle::{GrpcServerSettings, ServiceLifecycle};
use kvmesh_runtime::tls::EdgeTls;

pub use infer::{INFER_ENDPOINT, STREAM_ENDPOINT};
pub use service::KserveService;

use crate::http::AppState;
use crate::opts::KserveOpts;

/// The server settings the KServe options ask for on top of the process's (`base`: the stream
/// limit per connection), over TLS when `tls` is set.
pub fn server_settings(
    opts: &KserveOpts,
    tls: Option<&Arc<EdgeTls>>,
    base: GrpcServerSettings,
) -> GrpcServerSettings {
    GrpcServerSettings {
        initial_connection_window_size: opts.grpc_initial_connection_window_size,
        initial_stream_window_size: opts.grpc_initial_stream_window_size,
        tls: tls.cloned(),
        ..base
    }
}

/// Serves the KServe service over `state` on `listener` for the life of `lifecycle`, over TLS
/// when `tls` is set. Messages up to the HTTP body limit are accepted, so a prompt the HTTP edge
/// takes is taken here too.
pub fn serve(
    lifecycle: &mut ServiceLifecycle,
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    opts: &KserveOpts,
    tls: Option<&Arc<EdgeTls>>,
    base: GrpcServerSettings,
) {
    let message_limit = usize::try_from(state.settings.body_limit_mb.saturating_mul(1024 * 1024))
        .unwrap_or(usize::MAX);
    let service = KserveService::new(state, opts.kserve_stream_concurrency as usize);
    let server = GrpcInferenceServiceServer::new(service)
        .max_decoding_message_size(message_limit)
        .max_encoding_message_size(message_limit);
    let routes = tonic::service::Routes::new(server);
    lifecycle.serve_grpc_with(listener, routes, &server_settings(opts, tls, base));
}
