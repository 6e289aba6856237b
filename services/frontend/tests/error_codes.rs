//! Every `ErrorCode` a worker fails with reaches the HTTP client as that code's status, whatever
//! the message says: the code rides in the gRPC status's metadata, never in its text.
//!
//! The frontend runs in this process on in-memory discovery; the worker is a real gRPC server
//! (on loopback) that fails each request with the code the test sets and a message of its own.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use futures::StreamExt;
use kvmesh_frontend::FrontendOpts;
use kvmesh_proto::v1::worker_server::{Worker, WorkerServer};
use kvmesh_proto::v1::{
    ClearKvBlocksRequest, ClearKvBlocksResponse, GenerateRequest, GetLoadRequest, GetLoadResponse,
    InstanceRecord, ModelCard, ModelRecord, ModelRuntimeConfig,
};
use kvmesh_runtime::ErrorCode;
use kvmesh_runtime::GrpcErrorCode as _;
use kvmesh_runtime::connect::Embedded;
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::discovery::mem::MemDiscovery;
use kvmesh_runtime::discovery::registry::card_checksum;
use kvmesh_runtime::names;
use kvmesh_runtime::worker_client::ResponseStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A worker that fails every request with the code in `failure`; odd requests fail inside the
/// response stream (trailers), even ones on the call itself (trailers-only response).
#[derive(Clone, Default)]
struct FailingWorker {
    failure: Arc<Mutex<Option<ErrorCode>>>,
    num_requests: Arc<Mutex<u32>>,
}

#[tonic::async_trait]
impl Worker for FailingWorker {
    type GenerateStream = ResponseStream;

    async fn generate(
        &self,
        _request: tonic::Request<GenerateRequest>,
    ) -> Result<tonic::Response<ResponseStream>, tonic::Status> {
        let code = self.failure.lock().unwrap().unwrap_or(ErrorCode::Internal);
        let count = {
            let mut count = self.num_requests.lock().unwrap();
            *count += 1;
            *count
        };
        // A message no kvmesh code path has ever produced.
        let status = code.to_status(format!("failure number {count}, worded anew"));
        if count % 2 == 0 {
            return Err(status);
        }
        Ok(tonic::Response::new(
            futures::stream::iter([Err(status)]).boxed(),
        ))
    }

    async fn embed(
        &self,
        _request: tonic::Request<kvmesh_proto::v1::EmbedRequest>,
    ) -> Result<tonic::Response<kvmesh_proto::v1::EmbedResponse>, tonic::Status> {
        Err(kvmesh_runtime::GrpcErrorCode::to_status(
            kvmesh_runtime::ErrorCode::NotImplemented,
            "no embeddings",
        ))
    }

    async fn get_load(
        &self,
        _request: tonic::Request<GetLoadRequest>,
    ) -> Result<tonic::Response<GetLoadResponse>, tonic::Status> {
        Ok(tonic::Response::new(GetLoadResponse::default()))
    }

    async fn clear_kv_blocks(
        &self,
        _request: tonic::Request<ClearKvBlocksRequest>,
    ) -> Result<tonic::Response<ClearKvBlocksResponse>, tonic::Status> {
        Ok(tonic::Response::new(ClearKvBlocksResponse::default()))
    }
}

/// Registers the worker at `address` as serving `tiny` in `namespace`.
async fn register_worker(discovery: &MemDiscovery, namespace: &str, address: &str) {
    let model_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny");
    let card = ModelCard {
        display_name: "tiny".into(),
        source_path: std::fs::canonicalize(model_dir)
            .unwrap()
            .to_string_lossy()
            .into_owned(),
        kv_cache_block_size: 16,
        model_type: 3,
        model_input: "Tokens".into(),
        runtime_config: Some(ModelRuntimeConfig {
            total_kv_blocks: Some(1024),
            max_num_seqs: Some(64),
            max_num_batched_tokens: Some(8192),
            data_parallel_size: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    let worker_id = discovery.instance_id();
    let instance = InstanceRecord {
        namespace: namespace.into(),
        component: "backend".into(),
        endpoint: "generate".into(),
        instance_id: worker_id,
        address: address.into(),
        transport: "grpc".into(),
        device_type: "cpu".into(),
        ..Default::default()
    };
    let record = ModelRecord {
        namespace: namespace.into(),
        model: "tiny".into(),
        instance_id: worker_id,
        component: "backend".into(),
        endpoint: "generate".into(),
        card_checksum: card_checksum(&card),
        card: Some(card),
    };
    let model_key = names::model_key(namespace, "tiny", worker_id);
    let instance_key = names::instance_key(namespace, "backend", "generate", worker_id);
    discovery
        .put(&model_key, serde_json::to_vec(&record).unwrap().into())
        .await
        .unwrap();
    discovery
        .put(&instance_key, serde_json::to_vec(&instance).unwrap().into())
        .await
        .unwrap();
}

/// One HTTP/1.1 request; returns the status code and the body.
async fn http(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_error_code_reaches_the_client_whatever_its_message() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let worker_address = listener.local_addr().unwrap().to_string();
    let worker = FailingWorker::default();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(WorkerServer::new(worker.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let embedded = Embedded::new();
    let namespace = "errors";
    register_worker(
        &MemDiscovery::new(&embedded.store),
        namespace,
        &worker_address,
    )
    .await;
    let port = free_port();
    let opts = FrontendOpts::try_parse_from([
        "kvmesh-frontend",
        "--discovery-backend",
        "mem",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        &port.to_string(),
        "--namespace",
        namespace,
    ])
    .unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let frontend = tokio::spawn(kvmesh_frontend::run(opts, Some(embedded), shutdown.clone()));

    let mut is_ready = false;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
            && http(port, "GET", "/v1/models", "").await.1.contains("tiny")
        {
            is_ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(is_ready, "the frontend never served tiny");

    let body = r#"{"model":"tiny","prompt":"hello there","max_tokens":4}"#;
    for code in ErrorCode::ALL {
        for _ in 0..2 {
            *worker.failure.lock().unwrap() = Some(code);
            let (status, response) = http(port, "POST", "/v1/completions", body).await;
            assert_eq!(
                status,
                code.http_status(529),
                "{code:?} answered {status}: {response}"
            );
            let error: serde_json::Value = serde_json::from_str(&response).unwrap();
            assert_eq!(error["error"]["type"], code.openai_type(), "{code:?}");
        }
    }
    shutdown.cancel();
    frontend.await.unwrap().unwrap();
}
