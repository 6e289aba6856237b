//! The bridge's configuration: which engine it reads, for which worker and model it publishes.

use clap::Parser;
use kvmesh_runtime::config::{RuntimeOpts, parse_bool};

/// Options of `kvmesh-kv-bridge`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "kvmesh-kv-bridge",
    version,
    about = "Republishes an engine's vLLM/SGLang ZMQ KV events as kvmesh KV events"
)]
pub struct BridgeOpts {
    /// Shared runtime options (discovery, planes, logging).
    #[command(flatten)]
    pub runtime: RuntimeOpts,

    /// Instance id of the engine the bridge speaks for (decimal, or hex with `0x`).
    #[arg(long, env = "KVMESH_KV_BRIDGE_WORKER_ID", value_parser = parse_worker_id)]
    pub worker_id: u64,

    /// Namespace the worker is registered in.
    #[arg(long, env = "KVMESH_KV_BRIDGE_NAMESPACE", default_value = "dynamo")]
    pub namespace: String,

    /// Served model name (the subject's model token).
    #[arg(long, env = "KVMESH_KV_BRIDGE_MODEL_NAME")]
    pub model_name: String,

    /// Tokens per KV block of the model (its card's `kv_cache_block_size`).
    #[arg(long, env = "KVMESH_KV_BRIDGE_BLOCK_SIZE", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub block_size: u32,

    /// The engine's KV event endpoint. Connects to it, or binds when the host is a wildcard
    /// (`*`, `::`, `0.0.0.0`, which bind `--zmq-bind-host`) or with `--zmq-bind`. Rank r uses
    /// port + r.
    #[arg(
        long,
        env = "KVMESH_KV_BRIDGE_ZMQ_ENDPOINT",
        default_value = "tcp://127.0.0.1:5557"
    )]
    pub zmq_endpoint: String,

    /// Bind the endpoint (the engine connects, as vLLM does with a `tcp://HOST:PORT` endpoint).
    #[arg(long, env = "KVMESH_KV_BRIDGE_ZMQ_BIND", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub zmq_bind: bool,

    /// Address a bind endpoint with a wildcard host listens on: loopback unless set (`0.0.0.0`
    /// or `::` for every interface; kvmesh addition).
    #[arg(
        long,
        env = "KVMESH_KV_BRIDGE_ZMQ_BIND_HOST",
        default_value = "127.0.0.1"
    )]
    pub zmq_bind_host: String,

    /// Largest ZMQ message (all its frames) or command accepted from the engine; a connection
    /// that announces a larger one is dropped before it is read (kvmesh addition).
    #[arg(long, env = "KVMESH_KV_BRIDGE_ZMQ_MAX_MESSAGE_BYTES", default_value_t = 16 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub zmq_max_message_bytes: u64,

    /// Topic prefix to subscribe to ("" = every topic).
    #[arg(long, env = "KVMESH_KV_BRIDGE_ZMQ_TOPIC", default_value = "")]
    pub zmq_topic: String,

    /// The engine's replay (ROUTER) endpoint, used to fill sequence gaps; rank r uses port + r.
    #[arg(long, env = "KVMESH_KV_BRIDGE_ZMQ_REPLAY_ENDPOINT")]
    pub zmq_replay_endpoint: Option<String>,

    /// Data-parallel ranks of the engine: one socket per rank, rank r on the base port + r.
    #[arg(long, env = "KVMESH_KV_BRIDGE_DATA_PARALLEL_SIZE", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub data_parallel_size: u32,

    /// Continue the event ids this worker already has in the stream (after a bridge restart).
    #[arg(long, env = "KVMESH_KV_BRIDGE_RESUME_EVENT_IDS", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub resume_event_ids: bool,

    /// Serve Prometheus `/metrics` on this port (on `--tcp-rpc-host`); unset: no server.
    #[arg(long, env = "KVMESH_KV_BRIDGE_METRICS_PORT")]
    pub metrics_port: Option<u16>,

    /// Exit when the process with this pid, the bridge's parent, dies (an engine worker that
    /// starts its own bridge passes its pid): the kernel kills the bridge with SIGKILL when its
    /// parent exits, even by SIGKILL, so no bridge outlives its worker. The bridge refuses to
    /// start when its parent is not this pid (the worker died before the bridge got here).
    #[arg(long, env = "KVMESH_KV_BRIDGE_PARENT_PID")]
    pub parent_pid: Option<i32>,
}

fn parse_worker_id(value: &str) -> Result<u64, String> {
    let value = value.trim();
    let parsed = match value
        .strip_prefix("0x")
        .or_else(|| value.strip_prefix("0X"))
    {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    parsed.map_err(|_| format!("expected a u64 (decimal or 0x hex), got {value:?}"))
}

/// Whether an endpoint names a wildcard address to listen on rather than a peer: a `*`, `::`
/// (`[::]`) or `0.0.0.0` host.
pub fn is_bind_endpoint(endpoint: &str) -> bool {
    let Some(address) = endpoint.strip_prefix("tcp://") else {
        return false;
    };
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    matches!(host, "*" | "::" | "0.0.0.0")
}

/// The endpoint of `dp_rank`: a TCP endpoint's port plus the rank; other transports only have
/// rank 0.
pub fn rank_endpoint(endpoint: &str, dp_rank: u32) -> Result<String, String> {
    if dp_rank == 0 {
        return Ok(endpoint.to_string());
    }
    let (base, port) = endpoint
        .strip_prefix("tcp://")
        .and_then(|address| address.rsplit_once(':'))
        .ok_or_else(|| {
            format!("{endpoint}: several data-parallel ranks need a tcp://HOST:PORT endpoint")
        })?;
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{endpoint}: invalid port"))?;
    let port = u32::from(port) + dp_rank;
    if port > u32::from(u16::MAX) {
        return Err(format!(
            "{endpoint}: port + dp rank {dp_rank} exceeds 65535"
        ));
    }
    Ok(format!("tcp://{base}:{port}"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn env_names_are_unique() {
        kvmesh_runtime::config::check_unique_env(&BridgeOpts::command()).unwrap();
    }

    #[test]
    fn parses_flags() {
        let opts = BridgeOpts::try_parse_from([
            "kvmesh-kv-bridge",
            "--worker-id",
            "0x2a",
            "--model-name",
            "Qwen/Qwen3-0.6B",
            "--block-size",
            "32",
            "--zmq-bind",
            "--data-parallel-size",
            "2",
        ])
        .unwrap();
        assert_eq!(opts.worker_id, 42);
        assert!(opts.zmq_bind);
        assert!(opts.resume_event_ids);
        assert_eq!(opts.zmq_topic, "");
        assert_eq!(opts.namespace, "dynamo");
        assert!(
            BridgeOpts::try_parse_from(["x", "--worker-id", "nope", "--model-name", "m"]).is_err()
        );
    }

    #[test]
    fn endpoints_per_rank_and_bind_rule() {
        assert_eq!(
            rank_endpoint("tcp://127.0.0.1:5557", 2).unwrap(),
            "tcp://127.0.0.1:5559"
        );
        assert_eq!(
            rank_endpoint("tcp://[::1]:5557", 1).unwrap(),
            "tcp://[::1]:5558"
        );
        assert_eq!(rank_endpoint("ipc:///tmp/kv", 0).unwrap(), "ipc:///tmp/kv");
        assert!(rank_endpoint("ipc:///tmp/kv", 1).is_err());
        assert!(rank_endpoint("tcp://h:65535", 1).is_err());
        assert!(is_bind_endpoint("tcp://*:5557"));
        assert!(is_bind_endpoint("tcp://[::]:5557"));
        assert!(is_bind_endpoint("tcp://:::5557"));
        assert!(!is_bind_endpoint("tcp://127.0.0.1:5557"));
        assert!(!is_bind_endpoint("tcp://[::1]:5557"));
        assert!(!is_bind_endpoint("ipc:///tmp/kv"));
    }
}
