//! `kvmesh bench router-service`: one `kvmesh-router` replica's gRPC service on loopback, loaded
//! by concurrent callers that each `Route` a request and then `Report` its end (what a frontend
//! does per request), so the router's tracked load stays bounded as in production.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use clap::Args;
use clap::ValueEnum;
use kvmesh_kv::{
    ConcurrentIndex, KvEvent, KvEventBatch, KvEventKind, KvStored, KvStoredBlock, Tier,
    compute_block_hashes, seed_for,
};
use kvmesh_proto::v1::router_client::RouterClient;
use kvmesh_proto::v1::router_server::RouterServer;
use kvmesh_proto::v1::{
    ReportRequest, RouteRequest, RouteStreamRequest, RouteStreamResponse, TerminalPath,
    route_stream_request, route_stream_response,
};
use kvmesh_router::routed_models::RoutedModel;
use kvmesh_router::service::RouterService;
use kvmesh_routing::{
    MonotonicClock, RouterConfig, RouterCore, RouterMode, RuntimeConfig, SharedRouter, WorkerInfo,
};

/// Options of `kvmesh bench router-service`.
#[derive(Debug, Args)]
pub struct RouterServiceBench {
    /// Routing mode of the replica (`kv` reads an in-process index the bench fills).
    #[arg(long, default_value = "kv")]
    pub mode: String,
    /// Workers the replica routes among.
    #[arg(long, default_value_t = 16)]
    pub workers: u64,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 2048)]
    pub prompt_tokens: usize,
    /// Concurrent callers (each on its own HTTP/2 connection).
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Seconds of load.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Skip the `Report` after each `Route` (requests then stay tracked until expiry): the rate
    /// of decisions alone.
    #[arg(long)]
    pub no_report: bool,
    /// Route and report over one `RouteStream` per caller instead of unary calls.
    #[arg(long)]
    pub stream: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Tokens per KV block of the synthetic model.
const BLOCK_SIZE: u32 = 16;
/// Distinct shared prompt prefixes; each worker caches some of them.
const PREFIXES: usize = 32;

/// Runs the benchmark and prints its figures.
pub async fn run(args: RouterServiceBench) -> anyhow::Result<()> {
    let mode = RouterMode::from_str(&args.mode, true)
        .map_err(|e| anyhow::anyhow!("--mode {}: {e}", args.mode))?;
    let config = RouterConfig {
        mode,
        ..RouterConfig::default()
    };
    let prefixes: Vec<Vec<u32>> = (0..PREFIXES)
        .map(|p| {
            (0..args.prompt_tokens)
                .map(|i| (p * 7919 + i * 31) as u32 % 50_000)
                .collect()
        })
        .collect();
    let index = Arc::new(ConcurrentIndex::new(2));
    for worker in 0..args.workers {
        for (p, prompt) in prefixes.iter().enumerate() {
            if p as u64 % args.workers.max(1) != worker % PREFIXES as u64 {
                continue;
            }
            let local = compute_block_hashes(prompt, BLOCK_SIZE as usize, seed_for(None, None));
            let blocks = local
                .iter()
                .enumerate()
                .map(|(i, hash)| KvStoredBlock::new((p as u64) << 32 | i as u64, *hash))
                .collect();
            index.apply(KvEventBatch {
                worker_id: worker + 1,
                dp_rank: 0,
                events: vec![KvEvent {
                    event_id: p as u64,
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
    let core = RouterCore::new(config, "bench", BLOCK_SIZE, 7)?.with_overlap_source(index);
    let router = SharedRouter::new(core, Arc::new(MonotonicClock::new()));
    for worker in 0..args.workers {
        router.upsert_worker(WorkerInfo::new(worker + 1).with_runtime(RuntimeConfig {
            total_kv_blocks: Some(65_536),
            max_num_batched_tokens: Some(8192),
            data_parallel_start_rank: 0,
            data_parallel_size: 1,
        }));
    }
    let model = RoutedModel::new("bench", "bench", router, None, Vec::new());
    let table = Arc::new(ArcSwap::from_pointee(HashMap::from([(
        "bench".to_string(),
        Arc::new(model),
    )])));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(RouterServer::new(RouterService::new(
                table,
                kvmesh_router::metrics::RouterMetrics::new()?,
            )))
            .serve_with_incoming(kvmesh_runtime::net::nodelay_incoming(listener)),
    );

    let deadline = Instant::now() + Duration::from_secs_f64(args.duration);
    let mut callers = Vec::new();
    for caller in 0..args.concurrency.max(1) {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{address}"))?.tcp_nodelay(true);
        let mut client = RouterClient::new(endpoint.connect().await?);
        let prefixes = prefixes.clone();
        let send_reports = !args.no_report;
        let use_stream = args.stream;
        callers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failures = 0u64;
            let mut n = 0usize;
            if use_stream {
                let (tx, rx) = tokio::sync::mpsc::channel(64);
                let Ok(answers) = client
                    .route_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
                    .await
                else {
                    return (latencies, 1);
                };
                let mut answers = answers.into_inner();
                while Instant::now() < deadline {
                    n += 1;
                    let request_id = format!("{caller}-{n}");
                    let mut token_ids = prefixes[(caller * 7 + n) % PREFIXES].clone();
                    if let Some(last) = token_ids.last_mut() {
                        *last = n as u32;
                    }
                    let started = Instant::now();
                    let route = RouteRequest {
                        model: "bench".into(),
                        request_id: request_id.clone(),
                        token_ids,
                        ..Default::default()
                    };
                    if tx.send(stream_route(route)).await.is_err() {
                        failures += 1;
                        break;
                    }
                    let router_id = match answers.message().await {
                        Ok(Some(RouteStreamResponse {
                            result: Some(route_stream_response::Result::Decision(decision)),
                            ..
                        })) => decision.router_id,
                        _ => {
                            failures += 1;
                            break;
                        }
                    };
                    latencies.push(started.elapsed().as_secs_f64() * 1e6);
                    if send_reports {
                        let report = ReportRequest {
                            model: "bench".into(),
                            request_id,
                            router_id,
                            first_token: false,
                            output_tokens: 0,
                            terminal: TerminalPath::Completed as i32,
                        };
                        if tx.send(stream_report(report)).await.is_err() {
                            failures += 1;
                            break;
                        }
                    }
                }
                return (latencies, failures);
            }
            while Instant::now() < deadline {
                n += 1;
                let request_id = format!("{caller}-{n}");
                let mut token_ids = prefixes[(caller * 7 + n) % PREFIXES].clone();
                // A distinct tail, as real prompts differ after the shared prefix.
                if let Some(last) = token_ids.last_mut() {
                    *last = n as u32;
                }
                let started = Instant::now();
                let routed = client
                    .route(RouteRequest {
                        model: "bench".into(),
                        request_id: request_id.clone(),
                        token_ids,
                        ..Default::default()
                    })
                    .await;
                let Ok(routed) = routed else {
                    failures += 1;
                    continue;
                };
                latencies.push(started.elapsed().as_secs_f64() * 1e6);
                if !send_reports {
                    continue;
                }
                let report = ReportRequest {
                    model: "bench".into(),
                    request_id,
                    router_id: routed.into_inner().router_id,
                    first_token: false,
                    output_tokens: 0,
                    terminal: TerminalPath::Completed as i32,
                };
                if client.report(report).await.is_err() {
                    failures += 1;
                }
            }
            (latencies, failures)
        }));
    }
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut failures = 0;
    for caller in callers {
        let (mine, failed) = caller.await?;
        latencies.extend(mine);
        failures += failed;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let report = serde_json::json!({
        "mode": args.mode,
        "routes": latencies.len(),
        "route_calls_per_sec": latencies.len() as f64 / elapsed,
        "rpcs_per_sec": if args.no_report { 1.0 } else { 2.0 } * latencies.len() as f64 / elapsed,
        "reports": !args.no_report,
        "stream": args.stream,
        "route_p50_us": pct(0.5),
        "route_p99_us": pct(0.99),
        "failures": failures,
        "workers": args.workers,
        "prompt_tokens": args.prompt_tokens,
        "concurrency": args.concurrency,
    });
    if args.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

fn stream_route(route: RouteRequest) -> RouteStreamRequest {
    RouteStreamRequest {
        kind: Some(route_stream_request::Kind::Route(route)),
    }
}

fn stream_report(report: ReportRequest) -> RouteStreamRequest {
    RouteStreamRequest {
        kind: Some(route_stream_request::Kind::Report(report)),
    }
}
