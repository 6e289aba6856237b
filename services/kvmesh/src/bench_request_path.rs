//! `kvmesh bench request-path`: the work one chat request costs across the mesh, in one thread
//! and without sockets, so that `valgrind --tool=callgrind --toggle-collect=*request_path*`
//! counts exactly it: parse the body into the typed request, render the template, tokenize,
//! build and encode the worker request, decode it on the worker, run the mock engine until the
//! request finishes (block hashing, scheduling, KV events), encode the events as published and
//! apply them to a KV index as an indexer does.

use std::path::PathBuf;

use clap::Args;
use kvmesh_frontend::pipeline::generate_request;
use kvmesh_llm::openai::ChatCompletionRequest;
use kvmesh_llm::{ModelDir, TokenizerEngine};
use kvmesh_mocker::engine::{DpEngine, EngineConfig, EngineRequest};
use kvmesh_proto::v1 as pb;
use prost::Message as _;

/// Options of `kvmesh bench request-path`.
#[derive(Debug, Args)]
pub struct RequestPathBench {
    /// Model directory (tokenizer and chat template).
    #[arg(long)]
    pub model_path: PathBuf,
    /// Characters of the user message.
    #[arg(long, default_value_t = 12_000)]
    pub prompt_chars: usize,
    /// Requests to run (each a different text).
    #[arg(long, default_value_t = 1)]
    pub requests: usize,
    /// Output tokens per request.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Prompt encoder.
    #[arg(long, default_value = "default")]
    pub tokenizer: String,
}

/// Runs the requests and prints the prompt tokens and KV events they came to, as JSON.
pub fn run(args: &RequestPathBench) -> anyhow::Result<()> {
    let engine: TokenizerEngine = args.tokenizer.parse().map_err(anyhow::Error::msg)?;
    let model = ModelDir::load_with(&args.model_path, engine)?;
    let mut worker = DpEngine::new(
        EngineConfig {
            block_size: 16,
            num_gpu_blocks: 1 << 20,
            max_num_batched_tokens: 1 << 20,
            vocab_size: u32::try_from(model.vocab_size()).unwrap_or(u32::MAX),
            special_token_ids: model.tokenizer().added_token_ids().to_vec(),
            ..EngineConfig::default()
        },
        0,
    );
    let mut index = kvmesh_kv::RadixIndex::new();
    let (mut tokens, mut events) = (0, 0);
    for n in 0..args.requests {
        let body = serde_json::to_vec(&serde_json::json!({
            "model": "bench",
            "messages": [{"role": "user", "content": text(args.prompt_chars, n as u64)}],
            "max_tokens": args.max_tokens,
        }))?;
        let (t, e) = request_path(&model, &body, n as u64, &mut worker, &mut index)?;
        tokens += t;
        events += e;
    }
    println!(
        "{}",
        serde_json::json!({"prompt_tokens": tokens, "kv_events": events})
    );
    Ok(())
}

/// One request, end to end; returns its prompt tokens and the KV events it published.
#[inline(never)]
pub fn request_path(
    model: &ModelDir,
    body: &[u8],
    key: u64,
    worker: &mut DpEngine,
    index: &mut kvmesh_kv::RadixIndex,
) -> anyhow::Result<(usize, usize)> {
    let request: ChatCompletionRequest = serde_json::from_slice(body)?;
    let prompt = model.require_chat_template()?.render_request(&request)?;
    let ids = model.tokenizer().encode(&prompt, false)?;
    let num_tokens = ids.len();
    let sampling = request.sampling_options();
    let wire = generate_request(format!("r{key}"), "bench", ids, &sampling, 16);
    let received = pb::GenerateRequest::decode(wire.encode_to_vec().as_slice())?;
    worker.add_request(EngineRequest {
        key,
        request_id: received.request_id,
        prompt: received.token_ids,
        max_tokens: received.stop.and_then(|s| s.max_tokens),
        min_tokens: 0,
        stop_token_ids: Vec::new(),
        ignore_eos: true,
        lora_name: None,
        cache_salt: None,
        sampling: Default::default(),
        forced_output: Vec::new(),
        max_thinking_tokens: None,
        prompt_hashes: None,
    });
    let mut stored = 0;
    let mut event_id = 0;
    while worker.has_work() {
        let step = worker.step();
        let events: Vec<pb::KvEvent> = step
            .kv_events
            .into_iter()
            .map(|event| {
                event_id += 1;
                kvmesh_mocker::worker::to_proto(event, event_id)
            })
            .collect();
        if events.is_empty() {
            continue;
        }
        let published = pb::KvEventBatch {
            worker_id: 1,
            events,
            ..Default::default()
        }
        .encode_to_vec();
        let batch = kvmesh_indexer::convert::batch_from_proto(pb::KvEventBatch::decode(
            published.as_slice(),
        )?);
        stored += batch.events.len();
        index.apply(&batch);
    }
    Ok((num_tokens, stored))
}

/// `chars` characters of word-like text, different for every `seed`.
fn text(chars: usize, seed: u64) -> String {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = String::with_capacity(chars + 16);
    while out.len() < chars {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let len = 1 + (state % 9) as usize;
        for i in 0..len {
            out.push(char::from(b'a' + ((state >> (8 + i * 5)) % 26) as u8));
        }
        out.push(if state.is_multiple_of(11) { '\n' } else { ' ' });
    }
    out.truncate(chars);
    out
}
