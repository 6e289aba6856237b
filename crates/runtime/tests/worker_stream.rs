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
use kvmesh_runtime::GrpcErrorCode as _;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_streams_do_not_close_the_connection() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(WorkerServer::new(BurstWorker))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
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
