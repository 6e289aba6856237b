//! Runs one data-parallel rank of the engine core in real time: admits requests, steps the
//! scheduler, sleeps for each pass's simulated duration, streams tokens to callers and hands KV
//! events and load to the publisher.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvmesh_proto::v1::{
    FinishReason, GenerateResponse, TokenLogprob, TopLogprob, Usage, WorkerIdentity, WorkerLoad,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::engine::{DpEngine, EngineConfig, EngineRequest, FinishKind, KvCacheEvent};
use kvmesh_runtime::GrpcErrorCode as _;

/// Responses of one request, as the gRPC layer sends them.
pub type ResponseTx = mpsc::UnboundedSender<Result<GenerateResponse, tonic::Status>>;

/// How long a rank runs passes that take less than a millisecond of simulated time (a high
/// `--speedup-ratio`) before it lets other tasks run. Yielding after every pass instead hands
/// each token to its stream on its own, waking the request's task once per token.
const MAX_RUN_WITHOUT_YIELD: Duration = Duration::from_micros(200);

/// Work sent to a rank's loop.
pub enum Command {
    /// Admit a request and stream its responses to the sender.
    Add(Box<EngineRequest>, ResponseTx),
    /// Drop every cached block; replies with the number dropped.
    Clear(oneshot::Sender<u64>),
    /// Reply with the rank's current load.
    Load(oneshot::Sender<WorkerLoad>),
}

/// What a rank reports to its worker's publisher after a pass.
pub enum RankOutput {
    /// KV events of one pass, in order.
    KvEvents {
        /// Rank that produced them.
        dp_rank: u32,
        /// The events.
        events: Vec<KvCacheEvent>,
    },
    /// The rank's load changed.
    Load(WorkerLoad),
}

/// Timing settings of the real-time loop.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Divides every simulated duration; 0 means never sleep.
    pub speedup_ratio: f64,
    /// Further divides the decode term.
    pub decode_speedup_ratio: f64,
}

impl Pace {
    /// Real time one pass takes, in microseconds.
    pub fn pass_micros(&self, prefill_ms: f64, decode_ms: f64) -> f64 {
        if self.speedup_ratio <= 0.0 {
            return 0.0;
        }
        (prefill_ms + decode_ms / self.decode_speedup_ratio) / self.speedup_ratio * 1000.0
    }
}

struct Pending {
    tx: ResponseTx,
    num_prompt_tokens: u32,
    num_generated: u32,
}

/// Runs one rank until `shutdown`; every request still running then ends with CANCELLED.
pub async fn run_rank(
    worker_id: u64,
    dp_rank: u32,
    config: EngineConfig,
    pace: Pace,
    mut commands: mpsc::UnboundedReceiver<Command>,
    outputs: mpsc::UnboundedSender<RankOutput>,
    shutdown: CancellationToken,
) {
    let mut engine = DpEngine::new(config, dp_rank);
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    let mut next_key: u64 = 0;
    let mut sleep_debt_us = 0.0f64;
    let mut ran_since = Instant::now();
    let mut last_load: Option<WorkerLoad> = None;
    let mut last_load_at = Instant::now() - Duration::from_secs(1);
    let identity = WorkerIdentity { worker_id, dp_rank };

    loop {
        // Wait for work when idle, otherwise take whatever arrived since the last pass.
        if !engine.has_work() {
            // The throttle below may have held back the last pass's change; an idle rank publishes
            // no more passes, so a router would otherwise keep its busy figures for good.
            let load = load_of(&engine, worker_id, dp_rank);
            if last_load.as_ref() != Some(&load) {
                last_load = Some(load);
                last_load_at = Instant::now();
                let _ = outputs.send(RankOutput::Load(load));
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                command = commands.recv() => match command {
                    Some(command) => handle(command, &mut engine, &mut pending, &mut next_key, worker_id, dp_rank),
                    None => break,
                },
            }
            ran_since = Instant::now();
        }
        while let Ok(command) = commands.try_recv() {
            handle(
                command,
                &mut engine,
                &mut pending,
                &mut next_key,
                worker_id,
                dp_rank,
            );
        }
        if shutdown.is_cancelled() {
            break;
        }
        // Cancel requests whose caller went away before they produced anything more.
        let closed: Vec<u64> = pending
            .iter()
            .filter(|(_, p)| p.tx.is_closed())
            .map(|(key, _)| *key)
            .collect();
        for key in closed {
            pending.remove(&key);
            engine.cancel(key);
        }
        if !engine.has_work() {
            continue;
        }

        let step = engine.step();
        // The pass takes its simulated time before its tokens exist, as a forward pass does:
        // a first token comes a prefill after the request was admitted, not at once.
        sleep_debt_us += pace.pass_micros(step.prefill_ms, step.decode_ms);
        if sleep_debt_us >= 1000.0 {
            let started = Instant::now();
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_micros(sleep_debt_us as u64)) => {}
            }
            sleep_debt_us -= started.elapsed().as_micros() as f64;
            ran_since = Instant::now();
        } else if ran_since.elapsed() >= MAX_RUN_WITHOUT_YIELD {
            tokio::task::yield_now().await;
            ran_since = Instant::now();
        }
        for output in step.outputs {
            let Some(entry) = pending.get_mut(&output.key) else {
                continue;
            };
            let mut response = GenerateResponse::default();
            if let Some(FinishKind::Error(message)) = &output.finish {
                let _ = entry.tx.send(Err(
                    kvmesh_runtime::ErrorCode::InvalidArgument.to_status(message.clone())
                ));
                pending.remove(&output.key);
                continue;
            }
            response.token_ids.push(output.token_id);
            if let Some(logprobs) = output.logprobs {
                response.logprobs.push(TokenLogprob {
                    token_id: output.token_id,
                    logprob: logprobs.logprob,
                    top: logprobs
                        .top
                        .iter()
                        .map(|&(token_id, logprob)| TopLogprob { token_id, logprob })
                        .collect(),
                });
            }
            if output.is_first {
                response.worker = Some(identity);
            }
            entry.num_generated += 1;
            let finished = output.finish.is_some();
            if let Some(finish) = &output.finish {
                response.finish_reason = match finish {
                    FinishKind::Length => FinishReason::Length,
                    FinishKind::Stop => FinishReason::Stop,
                    FinishKind::Eos => FinishReason::Eos,
                    FinishKind::Error(_) => FinishReason::Error,
                } as i32;
                if matches!(finish, FinishKind::Stop) {
                    response.matched_stop_token_id = Some(output.token_id);
                }
            }
            if output.is_first || finished {
                response.usage = Some(Usage {
                    prompt_tokens: entry.num_prompt_tokens,
                    completion_tokens: entry.num_generated,
                    cached_tokens: output.cached_tokens,
                });
            }
            let closed = entry.tx.send(Ok(response)).is_err();
            if finished {
                pending.remove(&output.key);
            } else if closed {
                pending.remove(&output.key);
                engine.cancel(output.key);
            }
        }
        if !step.kv_events.is_empty() {
            let _ = outputs.send(RankOutput::KvEvents {
                dp_rank,
                events: step.kv_events,
            });
        }
        let load = load_of(&engine, worker_id, dp_rank);
        let changed = last_load.as_ref() != Some(&load);
        if changed && last_load_at.elapsed() >= Duration::from_millis(10) {
            last_load = Some(load);
            last_load_at = Instant::now();
            let _ = outputs.send(RankOutput::Load(load));
        }
    }
    for (_, entry) in pending.drain() {
        let _ = entry.tx.send(Ok(GenerateResponse {
            finish_reason: FinishReason::Cancelled as i32,
            ..Default::default()
        }));
    }
}

fn handle(
    command: Command,
    engine: &mut DpEngine,
    pending: &mut HashMap<u64, Pending>,
    next_key: &mut u64,
    worker_id: u64,
    dp_rank: u32,
) {
    match command {
        Command::Add(mut request, tx) => {
            let key = *next_key;
            *next_key += 1;
            request.key = key;
            pending.insert(
                key,
                Pending {
                    tx,
                    num_prompt_tokens: request.prompt.len() as u32,
                    num_generated: 0,
                },
            );
            engine.add_request(*request);
        }
        Command::Clear(reply) => {
            let _ = reply.send(engine.clear_cache() as u64);
        }
        Command::Load(reply) => {
            let _ = reply.send(load_of(engine, worker_id, dp_rank));
        }
    }
}

fn load_of(engine: &DpEngine, worker_id: u64, dp_rank: u32) -> WorkerLoad {
    let load = engine.load();
    WorkerLoad {
        worker_id,
        dp_rank,
        kv_used_blocks: load.kv_used_blocks as u64,
        kv_total_blocks: load.kv_total_blocks as u64,
        num_running: load.num_running as u32,
        num_waiting: load.num_waiting as u32,
        waiting_prefill_tokens: load.waiting_prefill_tokens as u64,
        published_at_ms: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unpaced rank (worker 7) running one request of `max_tokens`: its task, its shutdown,
    /// the request's responses and the rank's outputs to its publisher.
    struct UnpacedRank {
        rank: tokio::task::JoinHandle<()>,
        shutdown: CancellationToken,
        responses: mpsc::UnboundedReceiver<Result<GenerateResponse, tonic::Status>>,
        outputs: mpsc::UnboundedReceiver<RankOutput>,
    }

    fn unpaced_rank_with_request(max_tokens: u32) -> UnpacedRank {
        let (command_tx, command_rx) = mpsc::unbounded_channel();
        let (output_tx, outputs) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let pace = Pace {
            speedup_ratio: 0.0,
            decode_speedup_ratio: 1.0,
        };
        let rank = tokio::spawn(run_rank(
            7,
            0,
            EngineConfig::default(),
            pace,
            command_rx,
            output_tx,
            shutdown.clone(),
        ));
        let (response_tx, responses) = mpsc::unbounded_channel();
        let request = EngineRequest {
            request_id: "r".into(),
            prompt: (1..200).collect(),
            max_tokens: Some(max_tokens),
            ..EngineRequest::default()
        };
        command_tx
            .send(Command::Add(Box::new(request), response_tx))
            .map_err(|_| "rank stopped")
            .unwrap();
        UnpacedRank {
            rank,
            shutdown,
            responses,
            outputs,
        }
    }

    /// A rank whose last pass ends within the publish throttle still publishes its idle load.
    #[tokio::test]
    async fn an_idle_rank_publishes_its_final_load() {
        let UnpacedRank {
            rank,
            shutdown,
            mut responses,
            outputs: mut output_rx,
        } = unpaced_rank_with_request(3);
        let mut finished = false;
        while let Some(Ok(response)) = responses.recv().await {
            finished |= response.finish_reason != 0;
        }
        assert!(finished);
        // Unpaced passes run well within the 10 ms throttle: only the idle publish reports zero.
        let last = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match output_rx.recv().await {
                    Some(RankOutput::Load(load))
                        if load.num_running == 0 && load.num_waiting == 0 =>
                    {
                        return load;
                    }
                    Some(_) => {}
                    None => panic!("rank stopped"),
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(last.worker_id, 7);
        shutdown.cancel();
        rank.await.unwrap();
    }

    /// An unpaced rank runs several passes before it yields, so a request's task is woken for a
    /// batch of tokens rather than for each one.
    #[tokio::test]
    async fn an_unpaced_rank_hands_tokens_over_in_batches() {
        let UnpacedRank {
            rank,
            shutdown,
            mut responses,
            outputs: _outputs,
        } = unpaced_rank_with_request(16);
        let (mut num_tokens, mut num_batches) = (0, 0);
        while let Some(first) = responses.recv().await {
            num_batches += 1;
            num_tokens += first.unwrap().token_ids.len();
            while let Ok(next) = responses.try_recv() {
                num_tokens += next.unwrap().token_ids.len();
            }
        }
        assert_eq!(num_tokens, 16);
        assert!(num_batches < num_tokens / 2, "{num_batches} batches");
        shutdown.cancel();
        rank.await.unwrap();
    }
}
