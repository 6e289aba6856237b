//! `kvmesh bench kserve`: load on a running frontend's KServe gRPC edge, side by side with its
//! own `POST /v1/completions` (the path KServe requests map to) in the same run.
//!
//! Unary mode: `--concurrency` callers send unary `ModelInfer` (then non-streaming completions)
//! back to back; the gRPC callers share `--grpc-connections` HTTP/2 connections (0: one each;
//! gRPC clients multiplex calls on a few channels), the HTTP callers each have their own
//! HTTP/1.1 connection (HTTP/1.1 cannot multiplex). The phases alternate for `--rounds` so that
//! drift of the machine hits both; reported are requests per second, the load generator's own
//! CPU milliseconds per request and, with `--server-pid`, the server's (from `/proc/PID/stat`,
//! in the kernel's fixed 100 Hz user ticks). Stream mode (`--stream`): one `ModelStreamInfer` stream with
//! `--concurrency` streaming requests written at once, timed against one request alone.

use std::time::{Duration, Instant};

use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use kvmesh_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use kvmesh_proto::inference::infer_parameter::ParameterChoice;
use kvmesh_proto::inference::model_infer_request::InferInputTensor;
use kvmesh_proto::inference::{InferParameter, InferTensorContents, ModelInferRequest};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// Options of `kvmesh bench kserve`.
#[derive(Debug, Args)]
pub struct KserveBench {
    /// The KServe gRPC edge, `host:port`.
    #[arg(long)]
    pub grpc: String,
    /// The HTTP edge, `host:port`, for the `/v1/completions` side (unset: KServe only).
    #[arg(long)]
    pub http: Option<String>,
    /// Served model.
    #[arg(long, default_value = "tiny")]
    pub model: String,
    /// Concurrent callers (unary) or requests in flight on the one stream (`--stream`).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// HTTP/2 connections the unary gRPC callers share, round-robin (0: one per caller).
    #[arg(long, default_value_t = 0)]
    pub grpc_connections: usize,
    /// Output tokens per request (EOS ignored).
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u32,
    /// Seconds of load per phase.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// Times each phase runs, alternating.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// PID of the serving process, for its CPU time per request.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// One stream with `--concurrency` requests in flight, against one request alone.
    #[arg(long)]
    pub stream: bool,
}

/// Runs the benchmark and prints one JSON object.
pub async fn run(args: KserveBench) -> anyhow::Result<()> {
    let report = if args.stream {
        stream_report(&args).await?
    } else {
        unary_report(&args).await?
    };
    println!("{report}");
    Ok(())
}

/// What one phase measured.
#[derive(Debug, Default, Clone, Copy)]
struct Phase {
    requests: u64,
    failures: u64,
    seconds: f64,
    cpu_seconds: f64,
    client_cpu_seconds: f64,
}

impl Phase {
    fn add(&mut self, other: Phase) {
        self.requests += other.requests;
        self.failures += other.failures;
        self.seconds += other.seconds;
        self.cpu_seconds += other.cpu_seconds;
        self.client_cpu_seconds += other.client_cpu_seconds;
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "requests": self.requests,
            "failures": self.failures,
            "rps": self.requests as f64 / self.seconds.max(1e-9),
            "cpu_ms_per_request": self.cpu_seconds * 1000.0 / (self.requests.max(1) as f64),
            "client_cpu_ms_per_request":
                self.client_cpu_seconds * 1000.0 / (self.requests.max(1) as f64),
        })
    }
}

async fn unary_report(args: &KserveBench) -> anyhow::Result<serde_json::Value> {
    let (mut kserve, mut completions) = (Phase::default(), Phase::default());
    let channels = grpc_channels(args).await?;
    for _ in 0..args.rounds.max(1) {
        kserve.add(phase(args, |i| kserve_caller(args, &channels, i)).await?);
        if let Some(http) = &args.http {
            completions.add(phase(args, |i| http_caller(args, http, i)).await?);
        }
    }
    let mut report = serde_json::json!({"concurrency": args.concurrency, "max_tokens": args.max_tokens,
        "grpc_connections": channels.len(), "kserve_infer": kserve.json()});
    if args.http.is_some() {
        let rps = |p: &Phase| p.requests as f64 / p.seconds.max(1e-9);
        report["completions"] = completions.json();
        report["rps_ratio"] = (rps(&kserve) / rps(&completions).max(1e-9)).into();
    }
    Ok(report)
}

/// Runs `concurrency` callers for `duration`; each returns (requests, failures).
async fn phase<F, Fut>(args: &KserveBench, caller: F) -> anyhow::Result<Phase>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<(u64, u64)>> + Send + 'static,
{
    let cpu_before = cpu_seconds(args.server_pid)?;
    let client_before = cpu_seconds(Some(std::process::id()))?;
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.concurrency.max(1))
        .map(|i| tokio::spawn(caller(i)))
        .collect();
    let mut phase = Phase::default();
    for task in tasks {
        let (requests, failures) = task.await??;
        phase.requests += requests;
        phase.failures += failures;
    }
    phase.seconds = started.elapsed().as_secs_f64();
    phase.cpu_seconds = cpu_seconds(args.server_pid)? - cpu_before;
    phase.client_cpu_seconds = cpu_seconds(Some(std::process::id()))? - client_before;
    Ok(phase)
}

/// The server's user plus system CPU seconds so far (0 without a PID).
fn cpu_seconds(pid: Option<u32>) -> anyhow::Result<f64> {
    let Some(pid) = pid else { return Ok(0.0) };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((ticks(11) + ticks(12)) / 100.0)
}

fn prompt(caller: usize, n: u64) -> String {
    format!("Caller {caller} asks question {n}: what does a KV-cache-aware router do?")
}

fn infer_request(model: &str, text: String, max_tokens: u32, streaming: bool) -> ModelInferRequest {
    let input = |name: &str, datatype: &str, contents: InferTensorContents| InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape: vec![1],
        contents: Some(contents),
        ..InferInputTensor::default()
    };
    let mut request = ModelInferRequest {
        model_name: model.into(),
        inputs: vec![input(
            "text_input",
            "BYTES",
            InferTensorContents {
                bytes_contents: vec![text.into_bytes()],
                ..InferTensorContents::default()
            },
        )],
        ..ModelInferRequest::default()
    };
    if streaming {
        request.inputs.push(input(
            "streaming",
            "BOOL",
            InferTensorContents {
                bool_contents: vec![true],
                ..InferTensorContents::default()
            },
        ));
    }
    let parameter = |choice| InferParameter {
        parameter_choice: Some(choice),
    };
    request.parameters.insert(
        "max_tokens".into(),
        parameter(ParameterChoice::Int64Param(i64::from(max_tokens))),
    );
    request.parameters.insert(
        "ignore_eos".into(),
        parameter(ParameterChoice::BoolParam(true)),
    );
    request
}

async fn connect(address: &str) -> anyhow::Result<GrpcInferenceServiceClient<Channel>> {
    let channel = Channel::from_shared(format!("http://{address}"))?
        .tcp_nodelay(true)
        .connect()
        .await?;
    Ok(GrpcInferenceServiceClient::new(channel))
}

/// The connections the unary callers share (`--grpc-connections`; none when each caller is to
/// open its own).
async fn grpc_channels(
    args: &KserveBench,
) -> anyhow::Result<Vec<GrpcInferenceServiceClient<Channel>>> {
    let mut channels = Vec::with_capacity(args.grpc_connections);
    for _ in 0..args.grpc_connections {
        channels.push(connect(&args.grpc).await?);
    }
    Ok(channels)
}

fn kserve_caller(
    args: &KserveBench,
    channels: &[GrpcInferenceServiceClient<Channel>],
    caller: usize,
) -> impl Future<Output = anyhow::Result<(u64, u64)>> + Send + 'static {
    let (address, model, max_tokens) = (args.grpc.clone(), args.model.clone(), args.max_tokens);
    let deadline = Instant::now() + Duration::from_secs_f64(args.duration);
    let shared = (!channels.is_empty()).then(|| channels[caller % channels.len()].clone());
    async move {
        let mut client = match shared {
            Some(client) => client,
            None => connect(&address).await?,
        };
        let (mut done, mut failed) = (0, 0);
        while Instant::now() < deadline {
            let request = infer_request(&model, prompt(caller, done + failed), max_tokens, false);
            match client.model_infer(request).await {
                Ok(_) => done += 1,
                Err(_) => failed += 1,
            }
        }
        Ok((done, failed))
    }
}

fn http_caller(
    args: &KserveBench,
    address: &str,
    caller: usize,
) -> impl Future<Output = anyhow::Result<(u64, u64)>> + Send + 'static {
    let (address, model, max_tokens) = (address.to_string(), args.model.clone(), args.max_tokens);
    let deadline = Instant::now() + Duration::from_secs_f64(args.duration);
    async move {
        let stream = tokio::net::TcpStream::connect(&address).await?;
        stream.set_nodelay(true)?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let (mut done, mut failed) = (0, 0);
        while Instant::now() < deadline {
            let body = serde_json::json!({"model": model, "prompt": prompt(caller, done + failed),
                "max_tokens": max_tokens, "ignore_eos": true});
            let request = hyper::Request::post("/v1/completions")
                .header("host", address.as_str())
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(serde_json::to_vec(&body)?)))?;
            let response = sender.send_request(request).await?;
            let ok = response.status().is_success();
            response.into_body().collect().await?;
            if ok {
                done += 1;
            } else {
                failed += 1;
            }
        }
        Ok((done, failed))
    }
}

async fn stream_report(args: &KserveBench) -> anyhow::Result<serde_json::Value> {
    let mut client = connect(&args.grpc).await?;
    let (mut alone, mut together) = (Vec::new(), Vec::new());
    for round in 0..args.rounds.max(1) {
        alone.push(stream_batch(&mut client, args, 1, round).await?);
        together.push(stream_batch(&mut client, args, args.concurrency, round).await?);
    }
    let median = |times: &mut Vec<f64>| {
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    let (one, batch) = (median(&mut alone), median(&mut together));
    Ok(
        serde_json::json!({"requests_in_flight": args.concurrency, "max_tokens": args.max_tokens,
        "one_request_s": one, "stream_batch_s": batch, "ratio": batch / one}),
    )
}

/// Seconds until `count` streaming requests written at once on one stream all finished.
async fn stream_batch(
    client: &mut GrpcInferenceServiceClient<Channel>,
    args: &KserveBench,
    count: usize,
    round: usize,
) -> anyhow::Result<f64> {
    let requests: Vec<_> = (0..count)
        .map(|i| {
            let mut request =
                infer_request(&args.model, prompt(i, round as u64), args.max_tokens, true);
            request.id = format!("r{i}");
            request
        })
        .collect();
    let started = Instant::now();
    let (sender, receiver) = tokio::sync::mpsc::channel(count.max(1));
    for request in requests {
        sender.send(request).await?;
    }
    let mut responses = client
        .model_stream_infer(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await?
        .into_inner();
    let mut finished = 0;
    while finished < count {
        let Some(response) = responses.next().await else {
            anyhow::bail!("the stream ended with {finished} of {count} requests finished");
        };
        let response = response?;
        if !response.error_message.is_empty() {
            anyhow::bail!("a request failed: {}", response.error_message);
        }
        let is_last = response
            .infer_response
            .as_ref()
            .is_some_and(|r| r.parameters.contains_key("completion_tokens"));
        finished += usize::from(is_last);
    }
    drop(sender);
    Ok(started.elapsed().as_secs_f64())
}
