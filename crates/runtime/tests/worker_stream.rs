//! A worker's HTTP/2 connection survives callers that read their streams slowly.
//!
//! Many streams of one-token responses that nobody reads for a while used to pile up as small
//! DATA frames inside h2, which then closed the whole connection (GOAWAY `ENHANCE_YOUR_CALM`)
//! and failed every stream on it. The worker client drains each stream as it arrives instead.

use std::time::Duration;

use futures::StreamExt;
use kvmesh_proto::v1::worker_server::{Worker, WorkerServer};
use kvmesh_proto::v1::{
    ClearKvBlocksRequest, ClearKvBlocksResponse, FinishReason, GenerateRequest, GenerateResponse,
    GetLoadRequest, GetLoadResponse, StopConditions, Usage, WorkerIdentity,
};
use kvmesh_runtime::ErrorCode;
use kvmesh_runtime::GrpcErrorCode;
use kvmesh_runtime::worker_client::{GrpcSettings, ResponseStream, connect_worker};

/// Streams `max_tokens` one-token responses as fast as it can, then a finish with usage.
struct BurstWorker;

#[tonic::async_trait]
impl Worker for BurstWorker {
    type GenerateStream = ResponseStream;

    async fn generate(
        &self,
        request: tonic::Request<GenerateRequest>,
    ) -> Result<tonic::Response<ResponseStream>, tonic::Status> {
        let request = request.into_inner();
        if request.request_id == "hang" {
            // Accepts the connection, never answers the call.
            std::future::pending::<()>().await;
        }
        let num_tokens = request.stop.and_then(|s| s.max_tokens).unwrap_or(1);
        // One message per poll, so each goes out in its own small DATA frame.
        let responses = futures::stream::unfold(0u32, move |index| async move {
            if index > num_tokens {
                return None;
            }
            tokio::task::yield_now().await;
            let response = if index == num_tokens {
                GenerateResponse {
                    finish_reason: FinishReason::Length as i32,
                    usage: Some(Usage {
                        prompt_tokens: 1,
                        completion_tokens: num_tokens,
                        cached_tokens: 0,
                    }),
                    ..Default::default()
                }
            } else {
                GenerateResponse {
                    token_ids: vec![index],
                    worker: (index == 0).then_some(WorkerIdentity {
                        worker_id: 7,
                        dp_rank: 0,
                    }),
                    ..Default::default()
                }
            };
            Some((Ok(response), index + 1))
        });
        Ok(tonic::Response::new(responses.boxed()))
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
        Err(ErrorCode::NotImplemented.to_status("not a real worker"))
    }

    async fn clear_kv_blocks(
        &self,
        _request: tonic::Request<ClearKvBlocksRequest>,
    ) -> Result<tonic::Response<ClearKvBlocksResponse>, tonic::Status> {
        Err(ErrorCode::NotImplemented.to_status("not a real worker"))
    }
}

async fn serve_burst_worker() -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?.to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(WorkerServer::new(BurstWorker))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    Ok(address)
}

fn request(id: &str, num_prompt_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        request_id: id.into(),
        token_ids: vec![1000; num_prompt_tokens],
        stop: Some(StopConditions {
            max_tokens: Some(2),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The `DYN_TCP_*` limits as the frontend and router read them.
fn settings_from(args: &[&str]) -> Result<GrpcSettings, clap::Error> {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        runtime: kvmesh_runtime::config::RuntimeOpts,
    }
    let cli =
        <Cli as clap::Parser>::try_parse_from(std::iter::once("t").chain(args.iter().copied()))?;
    Ok(cli.runtime.grpc_settings())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_does_not_accept_in_time_is_unavailable() {
    let address = serve_burst_worker().await.unwrap();
    let settings = settings_from(&["--tcp-request-timeout", "0.3"]).unwrap();
    assert_eq!(settings.request_timeout, Duration::from_millis(300));
    let worker = connect_worker(&address, &settings).unwrap();
    let started = std::time::Instant::now();
    let Err(status) = worker.generate(request("hang", 4)).await else {
        panic!("a worker that never answers was taken as accepting");
    };
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(ErrorCode::of_status(&status), ErrorCode::Unavailable);
    assert!(
        status.message().contains("DYN_TCP_REQUEST_TIMEOUT"),
        "{status}"
    );
    // The same connection still serves a worker that answers.
    let mut stream = worker.generate(request("ok", 4)).await.unwrap();
    while let Some(item) = stream.next().await {
        item.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_message_limit_is_refused_naming_it() {
    let address = serve_burst_worker().await.unwrap();
    let settings = settings_from(&["--tcp-max-message-size", "4096"]).unwrap();
    assert_eq!(settings.max_message_size, 4096);
    let worker = connect_worker(&address, &settings).unwrap();
    let Err(status) = worker.generate(request("big", 3000)).await else {
        panic!("6 KB of token ids went through a 4 KiB limit");
    };
    assert_eq!(ErrorCode::of_status(&status), ErrorCode::PayloadTooLarge);
    assert!(
        status.message().contains("DYN_TCP_MAX_MESSAGE_SIZE"),
        "{status}"
    );
    let mut stream = worker.generate(request("small", 100)).await.unwrap();
    while let Some(item) = stream.next().await {
        item.unwrap();
    }
    // The default limit (32 MiB) carries the big one.
    let worker = connect_worker(&address, &settings_from(&[]).unwrap()).unwrap();
    let mut stream = worker.generate(request("big", 3000)).await.unwrap();
    while let Some(item) = stream.next().await {
        item.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_streams_do_not_close_the_connection() {
    let address = serve_burst_worker().await.unwrap();
    let worker = connect_worker(&address, &GrpcSettings::default()).unwrap();

    const NUM_STREAMS: usize = 64;
    const NUM_TOKENS: u32 = 1000;
    let mut streams = Vec::new();
    for index in 0..NUM_STREAMS {
        let request = GenerateRequest {
            request_id: format!("r{index}"),
            token_ids: vec![1],
            stop: Some(StopConditions {
                max_tokens: Some(NUM_TOKENS),
                ..Default::default()
            }),
            ..Default::default()
        };
        streams.push(worker.generate(request).await.unwrap());
    }
    // Nobody reads while the worker sends everything: 64 000 small frames, far past what h2
    // keeps unread on one connection.
    tokio::time::sleep(Duration::from_millis(500)).await;

    for (index, mut stream) in streams.into_iter().enumerate() {
        let mut tokens = Vec::new();
        let mut finish = None;
        let mut worker_id = None;
        while let Some(item) = stream.next().await {
            let response = item.unwrap_or_else(|status| panic!("stream {index}: {status}"));
            worker_id = worker_id.or(response.worker.map(|w| w.worker_id));
            tokens.extend(response.token_ids);
            if response.finish_reason != 0 {
                finish = Some(response.finish_reason);
                assert_eq!(response.usage.unwrap().completion_tokens, NUM_TOKENS);
            }
        }
        assert_eq!(
            tokens,
            (0..NUM_TOKENS).collect::<Vec<_>>(),
            "stream {index}"
        );
        assert_eq!(finish, Some(FinishReason::Length as i32), "stream {index}");
        assert_eq!(worker_id, Some(7), "stream {index}");
    }
}
