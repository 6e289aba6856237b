//! Configuration shared by every kvmesh binary: the common option groups, strict boolean parsing,
//! `--dump-config-to`, and the checks that keep environment names unique.
//!
//! Every option is a clap argument with an environment variable, so the precedence is CLI, then
//! environment, then default. Invalid values stop start-up with clap's one-line error naming the
//! flag (exit status 2).

use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, ValueEnum};

pub use kvmesh_core::flags::{check_unique_env, env_truthy, is_truthy, negatable, parse_bool};

pub mod credentials;
mod tls;

pub use self::tls::TlsOpts;

use crate::telemetry::LogFormat;
use crate::{Error, Result};

/// Environment variable names, one place for all of them.
pub mod env {
    /// Discovery backend.
    pub const DISCOVERY_BACKEND: &str = "DYN_DISCOVERY_BACKEND";
    /// Request plane.
    pub const REQUEST_PLANE: &str = "DYN_REQUEST_PLANE";
    /// Event plane.
    pub const EVENT_PLANE: &str = "DYN_EVENT_PLANE";
    /// etcd endpoints, comma separated.
    pub const ETCD_ENDPOINTS: &str = "ETCD_ENDPOINTS";
    /// NATS server URL.
    pub const NATS_SERVER: &str = "NATS_SERVER";
    /// Root directory of the file discovery backend.
    pub const FILE_KV: &str = "DYN_FILE_KV";
    /// Retention of the KV event stream, seconds.
    pub const NATS_STREAM_MAX_AGE: &str = "DYN_NATS_STREAM_MAX_AGE";
    /// Number of KV event partitions.
    pub const KV_PARTITIONS: &str = "KVMESH_KV_PARTITIONS";
    /// Seconds a lost registration may stay lost before a worker refuses new work.
    pub const REGISTRATION_GRACE_SECS: &str = "KVMESH_REGISTRATION_GRACE_SECS";
    /// Log format.
    pub const LOG_FORMAT: &str = "KVMESH_LOG_FORMAT";
    /// Where to write the resolved configuration.
    pub const DUMP_CONFIG_TO: &str = "DYN_DUMP_CONFIG_TO";
    /// Host internal gRPC servers bind to.
    pub const TCP_RPC_HOST: &str = "DYN_TCP_RPC_HOST";
    /// Port internal gRPC servers bind to (0 = any).
    pub const TCP_RPC_PORT: &str = "DYN_TCP_RPC_PORT";
    /// Largest message on the internal gRPC, bytes.
    pub const TCP_MAX_MESSAGE_SIZE: &str = "DYN_TCP_MAX_MESSAGE_SIZE";
    /// Most concurrent gRPC streams per connection a server admits (kvmesh addition).
    pub const TCP_MAX_CONCURRENT_STREAMS: &str = "KVMESH_TCP_MAX_CONCURRENT_STREAMS";
    /// Seconds allowed to connect to a peer's internal gRPC.
    pub const TCP_CONNECT_TIMEOUT: &str = "DYN_TCP_CONNECT_TIMEOUT";
    /// Seconds a worker may take to accept a request.
    pub const TCP_REQUEST_TIMEOUT: &str = "DYN_TCP_REQUEST_TIMEOUT";
}

/// Where processes find each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiscoveryBackend {
    /// etcd with leases: many hosts.
    Etcd,
    /// Files in a shared directory: one host, many processes.
    File,
    /// In-process memory: one process (`kvmesh up`).
    Mem,
    /// Kubernetes endpoints (not yet supported: refuses to start).
    Kubernetes,
}

/// How requests reach workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestPlane {
    /// gRPC over TCP (tonic).
    Tcp,
    /// NATS request plane (not yet supported: refuses to start).
    Nats,
}

/// How responses travel back; `tcp` is the same gRPC stream as the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ResponsePlane {
    /// The request's gRPC stream.
    Tcp,
    /// QUIC (not yet supported: refuses to start).
    Quic,
}

/// How events (KV events, load) travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventPlaneKind {
    /// NATS with JetStream (in-process when discovery is `mem`).
    Nats,
    /// ZMQ event plane (not yet supported: refuses to start).
    Zmq,
}

/// Options every kvmesh process shares: discovery, planes, logging, configuration dump.
#[derive(Debug, Clone, Args)]
pub struct RuntimeOpts {
    /// Discovery backend: etcd (multi-host), file (one host), mem (one process).
    #[arg(long, env = env::DISCOVERY_BACKEND, value_enum, default_value = "etcd")]
    pub discovery_backend: DiscoveryBackend,

    /// Request plane; `tcp` is gRPC over TCP.
    #[arg(long, env = env::REQUEST_PLANE, value_enum, default_value = "tcp")]
    pub request_plane: RequestPlane,

    /// Response plane; `tcp` streams responses on the request's gRPC stream.
    #[arg(long, env = "DYN_RESPONSE_PLANE", value_enum, default_value = "tcp")]
    pub response_plane: ResponsePlane,

    /// Event plane; unset picks NATS (in-process with mem discovery).
    #[arg(long, env = env::EVENT_PLANE, value_enum)]
    pub event_plane: Option<EventPlaneKind>,

    /// etcd endpoints, comma separated.
    #[arg(long, env = env::ETCD_ENDPOINTS, default_value = "http://localhost:2379", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,

    /// NATS server URL.
    #[arg(long, env = env::NATS_SERVER, default_value = "nats://localhost:4222")]
    pub nats_server: String,

    /// Root directory of the file discovery backend (default `$TMPDIR/dynamo_store_kv`).
    #[arg(long, env = env::FILE_KV)]
    pub file_kv: Option<PathBuf>,

    /// Retention of the KV event stream in seconds.
    #[arg(long, env = env::NATS_STREAM_MAX_AGE, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub nats_stream_max_age: u64,

    /// KV event partitions P (fixed for the life of a namespace).
    #[arg(long, env = env::KV_PARTITIONS, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub kv_partitions: u32,

    /// Seconds a lost discovery registration may stay lost before a worker refuses new work.
    #[arg(long, env = env::REGISTRATION_GRACE_SECS, default_value_t = 30)]
    pub registration_grace_secs: u64,

    /// Log line format.
    #[arg(long, env = env::LOG_FORMAT, value_enum, default_value = "human")]
    pub log_format: LogFormat,

    /// Write every resolved option, its value and its source as JSON to this file, then go on.
    #[arg(long, env = env::DUMP_CONFIG_TO)]
    pub dump_config_to: Option<PathBuf>,

    /// Host that internal gRPC servers bind to and advertise.
    #[arg(long, env = env::TCP_RPC_HOST, default_value = "127.0.0.1")]
    pub tcp_rpc_host: String,

    /// Port of this process's internal gRPC server (0 = any free port).
    #[arg(long, env = env::TCP_RPC_PORT, default_value_t = 0)]
    pub tcp_rpc_port: u16,

    /// Largest message, in bytes, that internal gRPC servers and clients send or accept (a
    /// long prompt's token ids travel in one message).
    #[arg(long, env = env::TCP_MAX_MESSAGE_SIZE, hide = true, default_value_t = 32 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1024..=u32::MAX as u64))]
    pub tcp_max_message_size: u64,

    /// Most concurrent streams one client connection may open on a gRPC server; a client past it
    /// waits for a stream to end (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; kvmesh addition).
    #[arg(long, env = env::TCP_MAX_CONCURRENT_STREAMS, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub tcp_max_concurrent_streams: u32,

    /// Seconds allowed to open a connection to a worker or another service.
    #[arg(long, env = env::TCP_CONNECT_TIMEOUT, hide = true, default_value_t = 3.0, value_parser = positive_seconds)]
    pub tcp_connect_timeout: f64,

    /// Seconds a worker may take to accept a request (answer the call's headers); a worker that
    /// takes longer is treated as unreachable and the request goes to another one.
    #[arg(long, env = env::TCP_REQUEST_TIMEOUT, hide = true, default_value_t = 10.0, value_parser = positive_seconds)]
    pub tcp_request_timeout: f64,

    /// TLS of the edge, the internal gRPC and NATS.
    #[command(flatten)]
    pub tls: TlsOpts,
}

impl RuntimeOpts {
    /// Binds the process's gRPC listener on `--tcp-rpc-host:--tcp-rpc-port` (port 0: any free
    /// one); `what` names the service in the error.
    pub async fn bind_rpc(&self, what: &str) -> Result<tokio::net::TcpListener> {
        let bind: std::net::SocketAddr = format!("{}:{}", self.tcp_rpc_host, self.tcp_rpc_port)
            .parse()
            .map_err(|_| {
                Error::Config(format!(
                    "--tcp-rpc-host {}: not an address",
                    self.tcp_rpc_host
                ))
            })?;
        tokio::net::TcpListener::bind(bind)
            .await
            .map_err(|e| Error::Config(format!("bind {what} gRPC on {bind}: {e}")))
    }

    /// The settings of this process's gRPC clients to workers (`DYN_TCP_*` limits).
    pub fn grpc_settings(&self) -> crate::worker_client::GrpcSettings {
        crate::worker_client::GrpcSettings {
            connect_timeout: std::time::Duration::from_secs_f64(self.tcp_connect_timeout),
            request_timeout: std::time::Duration::from_secs_f64(self.tcp_request_timeout),
            max_message_size: self.max_message_size(),
            ..Default::default()
        }
    }

    /// The settings every gRPC server of this process runs with (edge options aside).
    pub fn grpc_server_settings(&self) -> crate::lifecycle::GrpcServerSettings {
        crate::lifecycle::GrpcServerSettings {
            max_concurrent_streams: Some(self.tcp_max_concurrent_streams),
            ..Default::default()
        }
    }

    /// `--registration-grace-secs` as the lifecycle's registration grace.
    pub fn registration_grace(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.registration_grace_secs)
    }

    /// `DYN_TCP_MAX_MESSAGE_SIZE` as a message limit for tonic servers and clients.
    pub fn max_message_size(&self) -> usize {
        usize::try_from(self.tcp_max_message_size).unwrap_or(usize::MAX)
    }

    /// Refuses choices that are parsed for compatibility but not implemented yet.
    pub fn validate(&self) -> Result<()> {
        if self.discovery_backend == DiscoveryBackend::Kubernetes {
            return Err(Error::Config(
                "--discovery-backend (DYN_DISCOVERY_BACKEND): kubernetes is not supported yet"
                    .into(),
            ));
        }
        if self.request_plane == RequestPlane::Nats {
            return Err(Error::Config(
                "--request-plane (DYN_REQUEST_PLANE): nats is not supported yet; use tcp".into(),
            ));
        }
        if self.event_plane == Some(EventPlaneKind::Zmq) {
            return Err(Error::Config(
                "--event-plane (DYN_EVENT_PLANE): zmq is not supported yet; use nats".into(),
            ));
        }
        if self.response_plane == ResponsePlane::Quic {
            return Err(Error::Config(
                "--response-plane (DYN_RESPONSE_PLANE): quic is not supported yet; use tcp".into(),
            ));
        }
        self.tls.check().map_err(Error::Config)?;
        credentials::Credentials::from_env().map_err(Error::Config)?;
        Ok(())
    }

    /// Installs this process's mesh TLS from `--tcp-tls-*` ([`crate::tls::mesh::install`]);
    /// every binary calls it once at start, after [`validate`](Self::validate).
    pub fn install_mesh_tls(&self) -> Result<()> {
        crate::tls::mesh::install(self.tls.mesh_files()).map_err(Error::Config)
    }

    /// Root of the file discovery backend.
    pub fn file_kv_root(&self) -> PathBuf {
        self.file_kv
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("dynamo_store_kv"))
    }
}

/// Reads an optional numeric environment variable, naming it in the error.
pub fn env_number<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => value
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| Error::Config(format!("{name}: not a valid number: {value:?}"))),
        _ => Ok(None),
    }
}

/// A positive, finite number of seconds.
fn positive_seconds(value: &str) -> std::result::Result<f64, String> {
    match value.trim().parse::<f64>() {
        Ok(seconds) if seconds.is_finite() && seconds > 0.0 && seconds < 1e9 => Ok(seconds),
        _ => Err(format!("{value:?} is not a positive number of seconds")),
    }
}

fn raw_values(matches: &ArgMatches, id: &str) -> Vec<String> {
    matches
        .get_raw(id)
        .map(|raw| raw.map(|v| v.to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// One value as its most specific JSON type: a boolean, an integer, a number, else a string.
fn typed_value(text: &str) -> serde_json::Value {
    match text {
        "true" => return true.into(),
        "false" => return false.into(),
        _ => {}
    }
    if let Ok(number) = text.parse::<i64>() {
        return number.into();
    }
    match text.parse::<f64>() {
        Ok(number) if number.is_finite() && !text.is_empty() => number.into(),
        _ => text.into(),
    }
}

/// Every option's resolved value keyed by its field name (`router_mode`), typed as
/// [`typed_value`] reads it; a multi-valued option is a list and an unset one null. This is
/// the `config` a Python chat processor's provider receives.
pub fn resolved_values(command: &Command, matches: &ArgMatches) -> serde_json::Value {
    let mut options = serde_json::Map::new();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let values = raw_values(matches, id);
        let is_multiple = arg.get_num_args().is_some_and(|n| n.max_values() > 1)
            || matches!(arg.get_action(), clap::ArgAction::Append);
        let value = match values.as_slice() {
            [] if is_multiple => serde_json::Value::Array(Vec::new()),
            [] => serde_json::Value::Null,
            [one] if !is_multiple => typed_value(one),
            many => many.iter().map(|v| typed_value(v)).collect(),
        };
        options.insert(id.to_owned(), value);
    }
    serde_json::Value::Object(options)
}

/// [`parse_args`], also returning [`resolved_values`] of what was parsed.
pub fn parse_args_with_values<T: clap::Parser>(
    runtime: impl Fn(&T) -> &RuntimeOpts,
) -> (T, serde_json::Value) {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let opts = parse_from(args.clone(), runtime);
    let command = T::command();
    let values = command
        .clone()
        .try_get_matches_from(args)
        .map(|matches| resolved_values(&command, &matches))
        .unwrap_or_default();
    (opts, values)
}

/// Writes every argument's resolved value and source (`cli`, `env`, `default`) as JSON.
pub fn dump_config(command: &Command, matches: &ArgMatches, path: &Path) -> Result<()> {
    let mut options = serde_json::Map::new();
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        let source = match matches.value_source(id) {
            Some(ValueSource::CommandLine) => "cli",
            Some(ValueSource::EnvVariable) => "env",
            _ => "default",
        };
        let values = raw_values(matches, id);
        let value = match values.len() {
            0 => serde_json::Value::Null,
            1 if arg.get_num_args().is_none_or(|n| n.max_values() <= 1) => {
                serde_json::Value::String(values[0].clone())
            }
            _ => serde_json::Value::from(values),
        };
        let mut entry = serde_json::Map::new();
        entry.insert("value".into(), value);
        entry.insert("source".into(), source.into());
        if let Some(env) = arg.get_env().and_then(|e| e.to_str()) {
            entry.insert("env".into(), env.into());
        }
        options.insert(arg.get_long().unwrap_or(id).to_string(), entry.into());
    }
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(options))
        .map_err(|e| Error::Config(format!("--dump-config-to: {e}")))?;
    std::fs::write(path, text)
        .map_err(|e| Error::Config(format!("--dump-config-to {}: {e}", path.display())))
}

/// Parses `T` from the process arguments and environment, exits with status 2 and one line on an
/// invalid value, and honours `--dump-config-to` (read from the parsed `RuntimeOpts`).
pub fn parse_args<T: clap::Parser>(runtime: impl Fn(&T) -> &RuntimeOpts) -> T {
    parse_from(std::env::args_os(), runtime)
}

/// [`parse_args`] over explicit arguments (tests, `kvmesh up`).
pub fn parse_from<T: clap::Parser, I, S>(args: I, runtime: impl Fn(&T) -> &RuntimeOpts) -> T
where
    I: IntoIterator<Item = S>,
    S: Into<std::ffi::OsString> + Clone,
{
    let command = T::command();
    let matches = command.clone().get_matches_from(args);
    let opts = match T::from_arg_matches(&matches) {
        Ok(opts) => opts,
        Err(error) => error.exit(),
    };
    let runtime = runtime(&opts);
    if let Err(error) = runtime.validate().and_then(|()| runtime.install_mesh_tls()) {
        exit_config_error(&error.to_string());
    }
    if let Some(path) = &runtime.dump_config_to
        && let Err(error) = dump_config(&command, &matches, path)
    {
        exit_config_error(&error.to_string());
    }
    opts
}

/// Prints one `error: ...` line and exits with status 2, as clap does for invalid values.
pub fn exit_config_error(message: &str) -> ! {
    eprintln!("error: {message}");
    std::process::exit(2)
}

#[cfg(test)]
mod tests;
