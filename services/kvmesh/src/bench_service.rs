//! `kvmesh bench indexer-service`: one indexer replica serving `FindMatches` over gRPC on
//! loopback, loaded by concurrent callers on their own connections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvmesh_indexer::service::IndexerService;
use kvmesh_indexer::shard::{ShardLayout, ShardState};
use kvmesh_kv::{KvEvent, KvEventBatch, KvEventKind, KvStored, KvStoredBlock, Tier};
use kvmesh_proto::v1::indexer_client::IndexerClient;
use kvmesh_proto::v1::indexer_server::IndexerServer;
use kvmesh_proto::v1::{FindMatchesRequest, IndexerState};
use kvmesh_runtime::event_plane::mem::MemEventPlane;
use tokio::sync::mpsc;

use crate::bench::IndexerServiceBench;

/// Chain length of the synthetic sequences.
const CHAIN: u64 = 128;
/// Blocks shared by every chain of one prefix group.
const SHARED_PREFIX: u64 = 32;

/// Runs the benchmark and prints its figures.
pub async fn run(args: IndexerServiceBench) -> anyhow::Result<()> {
    let state = Arc::new(ShardState::new(ShardLayout::striped(0, 1, 16), 2));
    let index = state
        .model_or_insert("bench")
        .ok_or_else(|| anyhow::anyhow!("no room for the bench model"))?;
    let chains_per_worker = (args.blocks_per_worker / CHAIN).max(1);
    for worker in 0..args.workers {
        for chain in 0..chains_per_worker {
            let blocks = (0..CHAIN)
                .map(|depth| {
                    let token = if depth < SHARED_PREFIX {
                        chain % 8 * 1_000 + depth
                    } else {
                        (worker * chains_per_worker + chain) * 1_000_000 + depth
                    };
                    KvStoredBlock::new(worker << 40 | chain << 20 | depth, token)
                })
                .collect();
            index.apply(KvEventBatch {
                worker_id: worker + 1,
                dp_rank: 0,
                events: vec![KvEvent {
                    event_id: chain,
                    tier: Tier::Device,
                    kind: KvEventKind::Stored(KvStored {
                        parent_hash: None,
                        blocks,
                        start_position: None,
                    }),
                }],
                published_at_ms: 0,
                worker_removed: false,
                worker_readmitted: false,
            })?;
        }
    }
    index.flush()?;
    state.set_state(IndexerState::Serving);
    let entries = index.num_blocks();

    let (control_tx, _control_rx) = mpsc::channel(1);
    let metrics = Arc::new(kvmesh_indexer::metrics::IndexerMetrics::new()?);
    let service = IndexerService::new(
        state,
        control_tx,
        metrics,
        Arc::default(),
        Arc::new(MemEventPlane::new()),
        "bench".into(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(IndexerServer::new(service))
            .serve_with_incoming(kvmesh_runtime::net::nodelay_incoming(listener)),
    );

    let query: Vec<u64> = (0..args.query_blocks.min(CHAIN))
        .map(|depth| {
            if depth < SHARED_PREFIX {
                depth
            } else {
                chains_per_worker * 1_000_000 + depth
            }
        })
        .collect();
    let duration = Duration::from_secs_f64(args.duration);
    let unary = load(address, &query, args.concurrency, duration, false).await?;
    let streaming = load(address, &query, args.concurrency, duration, true).await?;
    let report = serde_json::json!({
        "queries": unary.queries,
        "queries_per_sec": unary.per_sec,
        "p50_us": unary.p50_us,
        "p99_us": unary.p99_us,
        "stream_queries": streaming.queries,
        "stream_queries_per_sec": streaming.per_sec,
        "stream_p50_us": streaming.p50_us,
        "stream_p99_us": streaming.p99_us,
        "entries": entries,
        "query_blocks": query.len(),
        "concurrency": args.concurrency,
    });
    if args.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// Throughput and latency of one load phase.
struct Phase {
    queries: usize,
    per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

/// Runs `concurrency` callers, each on its own connection, querying back to back for
/// `duration`: with unary `FindMatches` calls, or over one `FindMatchesStream` per caller (one
/// query in flight at a time, as a router waits for each answer).
async fn load(
    address: std::net::SocketAddr,
    query: &[u64],
    concurrency: usize,
    duration: Duration,
    streaming: bool,
) -> anyhow::Result<Phase> {
    let deadline = Instant::now() + duration;
    let mut callers = Vec::new();
    for _ in 0..concurrency.max(1) {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{address}"))?.tcp_nodelay(true);
        let mut client = IndexerClient::new(endpoint.connect().await?);
        let request = FindMatchesRequest {
            model: "bench".into(),
            local_hashes: query.to_vec(),
            ..Default::default()
        };
        callers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            if streaming {
                let (tx, rx) = mpsc::channel(1);
                let Ok(response) = client
                    .find_matches_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await
                else {
                    return latencies;
                };
                let mut answers = response.into_inner();
                while Instant::now() < deadline {
                    let started = Instant::now();
                    if tx.send(request.clone()).await.is_err() {
                        break;
                    }
                    match answers.message().await {
                        Ok(Some(_)) => latencies.push(started.elapsed().as_secs_f64() * 1e6),
                        _ => break,
                    }
                }
            } else {
                while Instant::now() < deadline {
                    let started = Instant::now();
                    if client.find_matches(request.clone()).await.is_ok() {
                        latencies.push(started.elapsed().as_secs_f64() * 1e6);
                    }
                }
            }
            latencies
        }));
    }
    let started = Instant::now();
    let mut latencies = Vec::new();
    for caller in callers {
        latencies.extend(caller.await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Ok(Phase {
        queries: latencies.len(),
        per_sec: latencies.len() as f64 / elapsed,
        p50_us: pct(0.5),
        p99_us: pct(0.99),
    })
}
