//! One mock worker: its ranks, its `Worker` gRPC service, and the publisher of its KV events
//! and load.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use kvmesh_proto::v1::worker_server::Worker;
use kvmesh_proto::v1::{
    ClearKvBlocksRequest, ClearKvBlocksResponse, EmbedRequest, EmbedResponse, GenerateRequest,
    GetLoadRequest, GetLoadResponse, KvEvent, StorageTier, kv_event,
};
use kvmesh_runtime::event_plane::EventPlane;
use kvmesh_runtime::kv_publish::{self, KvEventPublisher};
use kvmesh_runtime::shutdown::Inflight;
use kvmesh_runtime::worker_client::{ResponseStream, WorkerEndpoint};
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::driver::{Command, RankOutput};
use crate::engine::{EngineRequest, EngineSampling, KvCacheEvent, PromptHashes, Xoshiro256};
use crate::fault::{Fault, FaultFile};
use kvmesh_kv::{BlockHashCache, seed_for};
use kvmesh_llm::Tokenizer;
use kvmesh_llm::tool_calls::ToolCallFormat;
use kvmesh_runtime::lifecycle::WorkGate;
use kvmesh_runtime::{ErrorCode, GrpcErrorCode as _};

/// The request side of a mock worker: routes each request to its data-parallel rank.
#[derive(Clone)]
pub struct MockWorker {
    ranks: Arc<Vec<mpsc::UnboundedSender<Command>>>,
    inflight: Inflight,
    /// Tokenizes guided output.
    tokenizer: Arc<Tokenizer>,
    /// The syntax tool calls are written in (`--dyn-tool-call-parser`); without one the engine
    /// never calls tools.
    tool_format: Option<ToolCallFormat>,
    /// The engine's seed (`--seed`), which forced output is drawn with as free text is.
    seed: u64,
    /// `--fault-file`, read at every Generate call.
    fault: Option<Arc<FaultFile>>,
    /// Closed while the worker's registration stayed lost past the grace: new work is refused.
    gate: WorkGate,
    /// Block hashes of earlier prompts, found again by the cut points a request carries, and
    /// the block size they are hashed with (only with prefix caching).
    block_hashes: Option<(Arc<BlockHashCache>, usize)>,
}

/// What the worker's block-hash cache may hold: about 16 bytes per block and 72 per cut point
/// (docs/tokenization.md, "Memory"), so a few hundred long conversations (docs/mocker.md, "Prefix caching").
pub const BLOCK_HASH_CACHE_BYTES: usize = 32 << 20;

impl MockWorker {
    /// Wraps the command channels of a worker's ranks (index = dp rank), the model's
    /// tokenizer, the syntax its tool calls are written in and the engine's seed.
    pub fn new(
        ranks: Vec<mpsc::UnboundedSender<Command>>,
        tokenizer: Arc<Tokenizer>,
        tool_format: Option<ToolCallFormat>,
        seed: u64,
    ) -> Self {
        Self {
            ranks: Arc::new(ranks),
            inflight: Inflight::new(),
            tokenizer,
            tool_format,
            seed,
            fault: None,
            gate: WorkGate::open(),
            block_hashes: None,
        }
    }

    /// Hashes each prompt's blocks here with `block_size`, reusing those of an earlier prompt
    /// that shares a cut point with it (the cuts the router reuses its hashes by), so a long
    /// conversation's next turn hashes only its new blocks; the engine takes the hashes instead
    /// of hashing the prompt again. Leave it off when the engine does not cache prefixes.
    pub fn with_block_hash_cache(mut self, block_size: usize, max_bytes: usize) -> Self {
        self.block_hashes = Some((Arc::new(BlockHashCache::new(max_bytes)), block_size.max(1)));
        self
    }

    /// The prompt's block hashes from the cache, when the request carries cut points.
    fn prompt_hashes(&self, request: &GenerateRequest) -> Option<PromptHashes> {
        let (cache, block_size) = self.block_hashes.as_ref()?;
        if request.prefix_cuts.is_empty() {
            return None;
        }
        let cuts = kvmesh_runtime::prefix_cuts::cuts_from_proto(&request.prefix_cuts);
        let seed = seed_for(
            Some(request.lora_name.as_str()).filter(|name| !name.is_empty()),
            Some(request.cache_salt.as_str()).filter(|salt| !salt.is_empty()),
        );
        let block_size_u32 = u32::try_from(*block_size).ok()?;
        let (local, seq) = cache.hash(&request.token_ids, &cuts, block_size_u32, seed);
        Some(PromptHashes {
            block_size: *block_size,
            seed,
            local,
            seq,
        })
    }

    /// The block-hash cache's counters (hits, misses, blocks reused), when it is on.
    pub fn block_hash_stats(&self) -> Option<kvmesh_core::prefix::PrefixStats> {
        self.block_hashes.as_ref().map(|(cache, _)| cache.stats())
    }

    /// Reads `fault` at every Generate call to stall or fail it (docs/mocker.md, "Fault
    /// injection").
    pub fn with_fault_file(mut self, fault: Option<FaultFile>) -> Self {
        self.fault = fault.map(Arc::new);
        self
    }

    /// Refuses new generations (`UNAVAILABLE`, so the router picks another worker) while `gate`
    /// is closed.
    pub fn with_work_gate(mut self, gate: WorkGate) -> Self {
        self.gate = gate;
        self
    }

    /// The tokens of the output guided decoding forces, empty when the request is free: JSON
    /// that validates against the schema, a text the regex matches, or one of the choices. They
    /// are drawn as free text is: the same for a greedy or seeded request's prompt, different
    /// per request otherwise.
    fn forced_output(
        &self,
        request: &GenerateRequest,
        is_greedy: bool,
    ) -> Result<Vec<u32>, tonic::Status> {
        let sampling = request.sampling.clone().unwrap_or_default();
        let invalid = |message: String| ErrorCode::InvalidArgument.to_status(message);
        let mut rng = Xoshiro256::for_output(
            self.seed,
            &request.token_ids,
            &request.request_id,
            is_greedy,
            sampling.seed,
        );
        let text = match (
            sampling.guided_json_schema,
            sampling.guided_regex,
            sampling.guided_choice.is_empty(),
        ) {
            (None, None, true) => match self.tool_calls_text(request, &mut rng) {
                Some(text) => text,
                None => return Ok(Vec::new()),
            },
            (Some(schema), None, true) => {
                let schema: serde_json::Value = serde_json::from_str(&schema)
                    .map_err(|error| invalid(format!("guided_json_schema is not JSON: {error}")))?;
                crate::guided::json_for_schema(&schema, &mut rng)
            }
            (None, Some(pattern), true) => {
                crate::guided::text_for_regex(&pattern, &mut rng).map_err(invalid)?
            }
            (None, None, false) => crate::guided::pick_choice(&sampling.guided_choice, &mut rng)
                .unwrap_or_default()
                .to_owned(),
            _ => {
                return Err(invalid(
                    "at most one of guided_json_schema, guided_regex and guided_choice may be set"
                        .to_owned(),
                ));
            }
        };
        self.tokenizer.encode(&text, false).map_err(|error| {
            ErrorCode::Internal.to_status(format!("tokenize guided output: {error}"))
        })
    }

    /// The tool calls this turn makes, in the model's syntax, or `None` to answer in text.
    fn tool_calls_text(&self, request: &GenerateRequest, rng: &mut Xoshiro256) -> Option<String> {
        let format = self.tool_format?;
        let tools = request
            .tools
            .as_ref()
            .filter(|tools| !tools.tools.is_empty())?;
        let prompt = self.tokenizer.decode(&request.token_ids, false).ok()?;
        let calls = crate::tool_calls::calls_for(tools, &prompt, rng);
        (!calls.is_empty()).then(|| format.write(&calls))
    }

    /// Generations whose response stream is still open; shutdown drains them.
    pub fn inflight(&self) -> &Inflight {
        &self.inflight
    }

    fn start(&self, request: GenerateRequest) -> Result<ResponseStream, tonic::Status> {
        if !self.gate.is_open() {
            return Err(ErrorCode::Unavailable
                .to_status("worker registration lost past the grace; not taking new work"));
        }
        match self.fault.as_deref().map(FaultFile::current) {
            Some(Fault::Fail) => {
                return Err(kvmesh_runtime::ErrorCode::Internal
                    .to_status("injected fault: this worker fails every request"));
            }
            // Held open without an answer and without an in-flight entry: shutdown does not
            // wait for a stalled request.
            Some(Fault::Stall) => return Ok(futures::stream::pending().boxed()),
            Some(Fault::None) | None => {}
        }
        if request.token_ids.is_empty() {
            return Err(
                kvmesh_runtime::ErrorCode::InvalidArgument.to_status("token_ids must not be empty")
            );
        }
        let dp_rank = request
            .routing
            .as_ref()
            .and_then(|routing| routing.dp_rank)
            .unwrap_or(0);
        let rank = self.ranks.get(dp_rank as usize).ok_or_else(|| {
            kvmesh_runtime::ErrorCode::InvalidArgument.to_status(format!(
                "dp_rank {dp_rank} out of range (worker has {} ranks)",
                self.ranks.len()
            ))
        })?;
        let is_greedy = request
            .sampling
            .as_ref()
            .is_some_and(|sampling| sampling.greedy || sampling.temperature == Some(0.0));
        let forced_output = self.forced_output(&request, is_greedy)?;
        let prompt_hashes = self.prompt_hashes(&request);
        let stop = request.stop.unwrap_or_default();
        let sampling = request.sampling.unwrap_or_default();
        let engine_request = EngineRequest {
            key: 0,
            request_id: request.request_id,
            prompt: request.token_ids,
            max_tokens: stop.max_tokens,
            min_tokens: stop.min_tokens.unwrap_or(0),
            stop_token_ids: stop.stop_token_ids,
            ignore_eos: stop.ignore_eos,
            lora_name: Some(request.lora_name).filter(|name| !name.is_empty()),
            cache_salt: Some(request.cache_salt).filter(|salt| !salt.is_empty()),
            sampling: EngineSampling {
                greedy: is_greedy,
                seed: sampling.seed,
                logprobs: request.output.and_then(|output| output.logprobs),
            },
            forced_output,
            max_thinking_tokens: stop.max_thinking_tokens,
            prompt_hashes,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        rank.send(Command::Add(Box::new(engine_request), tx))
            .map_err(|_| {
                kvmesh_runtime::ErrorCode::Unavailable.to_status("worker is shutting down")
            })?;
        let guard = self.inflight.enter();
        Ok(UnboundedReceiverStream::new(rx)
            .map(move |item| {
                let _held_until_the_stream_drops = &guard;
                item
            })
            .boxed())
    }

    /// [`MockWorker::start`] as a step of `parent`'s trace: the worker's span of the request
    /// (docs/tracing.md); exactly `start` while tracing is off.
    fn start_traced(
        &self,
        request: GenerateRequest,
        parent: &kvmesh_runtime::otel::Trace,
    ) -> Result<ResponseStream, tonic::Status> {
        if !parent.is_active() {
            return self.start(request);
        }
        let span = crate::trace::span(parent, &request);
        self.start(request)
            .inspect_err(|status| span.fail(status.message()))
            .map(|stream| crate::trace::traced(stream, span))
    }

    async fn ask<T>(
        &self,
        make: impl Fn(oneshot::Sender<T>) -> Command,
    ) -> Result<Vec<T>, tonic::Status> {
        let mut replies = Vec::with_capacity(self.ranks.len());
        for rank in self.ranks.iter() {
            let (tx, rx) = oneshot::channel();
            rank.send(make(tx)).map_err(|_| {
                kvmesh_runtime::ErrorCode::Unavailable.to_status("worker is shutting down")
            })?;
            replies.push(rx.await.map_err(|_| {
                kvmesh_runtime::ErrorCode::Unavailable.to_status("worker is shutting down")
            })?);
        }
        Ok(replies)
    }
}

#[async_trait]
impl WorkerEndpoint for MockWorker {
    async fn generate(&self, request: GenerateRequest) -> Result<ResponseStream, tonic::Status> {
        self.start(request)
    }

    async fn generate_traced(
        &self,
        request: GenerateRequest,
        trace: &kvmesh_runtime::otel::Trace,
    ) -> Result<ResponseStream, tonic::Status> {
        self.start_traced(request, trace)
    }

    async fn embed(&self, request: EmbedRequest) -> Result<EmbedResponse, tonic::Status> {
        crate::embed::embed(&request)
    }
}

#[tonic::async_trait]
impl Worker for MockWorker {
    type GenerateStream = ResponseStream;

    async fn generate(
        &self,
        request: tonic::Request<GenerateRequest>,
    ) -> Result<tonic::Response<Self::GenerateStream>, tonic::Status> {
        let parent = kvmesh_runtime::otel::Trace::from_metadata(request.metadata());
        self.start_traced(request.into_inner(), &parent)
            .map(tonic::Response::new)
    }

    async fn embed(
        &self,
        request: tonic::Request<EmbedRequest>,
    ) -> Result<tonic::Response<EmbedResponse>, tonic::Status> {
        crate::embed::embed(request.get_ref()).map(tonic::Response::new)
    }

    async fn get_load(
        &self,
        _request: tonic::Request<GetLoadRequest>,
    ) -> Result<tonic::Response<GetLoadResponse>, tonic::Status> {
        let ranks = self.ask(Command::Load).await?;
        Ok(tonic::Response::new(GetLoadResponse { ranks }))
    }

    async fn clear_kv_blocks(
        &self,
        _request: tonic::Request<ClearKvBlocksRequest>,
    ) -> Result<tonic::Response<ClearKvBlocksResponse>, tonic::Status> {
        let cleared = self.ask(Command::Clear).await?;
        Ok(tonic::Response::new(ClearKvBlocksResponse {
            num_blocks_cleared: cleared.iter().sum(),
        }))
    }
}

/// Where a worker publishes.
pub struct PublishTarget {
    /// The event plane.
    pub events: Arc<dyn EventPlane>,
    /// Subject of this worker's KV events (its partition's subject).
    pub kv_subject: String,
    /// Subject of load reports.
    pub load_subject: String,
    /// The worker's instance id.
    pub worker_id: u64,
    /// Whether KV events are published at all (off without prefix caching).
    pub publish_kv_events: bool,
}

/// Publishes a worker's KV events (durably, in order, retried until stored) and its load.
pub async fn run_publisher(
    target: PublishTarget,
    num_ranks: usize,
    mut outputs: mpsc::UnboundedReceiver<RankOutput>,
    shutdown: CancellationToken,
) {
    let mut publisher = KvEventPublisher::new(
        target.events.clone(),
        target.kv_subject.clone(),
        target.worker_id,
        HashMap::new(),
    );
    loop {
        let first = tokio::select! {
            _ = shutdown.cancelled() => break,
            output = outputs.recv() => match output {
                Some(output) => output,
                None => break,
            },
        };
        // Coalesce whatever is already queued, per rank, keeping each rank's order.
        let mut pending: Vec<Vec<KvEvent>> = vec![Vec::new(); num_ranks];
        let mut output = Some(first);
        while let Some(item) = output.take() {
            match item {
                RankOutput::KvEvents { dp_rank, events } if target.publish_kv_events => {
                    if let Some(queue) = pending.get_mut(dp_rank as usize) {
                        queue.extend(events.into_iter().map(|event| to_proto(event, 0)));
                    }
                }
                RankOutput::KvEvents { .. } => {}
                RankOutput::Load(mut load) => {
                    load.published_at_ms = kv_publish::now_ms();
                    let payload = Bytes::from(load.encode_to_vec());
                    if let Err(error) = target.events.publish(&target.load_subject, payload).await {
                        tracing::debug!(%error, "load publish failed");
                    }
                }
            }
            output = outputs.try_recv().ok();
        }
        for (dp_rank, events) in pending.into_iter().enumerate() {
            if !events.is_empty()
                && publisher
                    .publish(dp_rank as u32, events, &shutdown)
                    .await
                    .is_err()
            {
                return;
            }
        }
    }
}

/// Converts an engine-core event to the wire form with its event id.
pub fn to_proto(event: KvCacheEvent, event_id: u64) -> KvEvent {
    let kind = match event {
        KvCacheEvent::Stored {
            parent_hash,
            blocks,
        } => kv_event::Kind::Stored(kvmesh_proto::v1::KvStored {
            parent_hash,
            blocks: blocks
                .into_iter()
                .map(|block| kvmesh_proto::v1::KvStoredBlock {
                    block_hash: block.block_hash,
                    tokens_hash: block.tokens_hash,
                    mm_hashes: Vec::new(),
                })
                .collect(),
            start_position: None,
        }),
        KvCacheEvent::Removed { block_hashes } => {
            kv_event::Kind::Removed(kvmesh_proto::v1::KvRemoved { block_hashes })
        }
        KvCacheEvent::Cleared => kv_event::Kind::Cleared(kvmesh_proto::v1::KvCleared {}),
    };
    KvEvent {
        event_id,
        tier: StorageTier::Device as i32,
        kind: Some(kind),
    }
}

#[cfg(test)]
#[path = "worker_tests.rs"]
mod tests;
