//! `kvmesh probe`: the health check of containers and Kubernetes pods, with no curl or
//! grpc_health_probe in the image. It exits 0 only when the service says it serves: a gRPC
//! server's `grpc.health.v1` answers SERVING, or an HTTP probe (`/health`, `/live`) answers 2xx.
//! An `https://` URL is checked against `--ca-cert-path` (the frontend of a TLS deployment).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use kvmesh_runtime::config::TlsOpts;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// What to probe.
#[derive(Subcommand)]
pub enum ProbeCommand {
    /// Ask a gRPC server's `grpc.health.v1` service; exit 0 only on SERVING.
    Grpc(Box<GrpcProbe>),
    /// GET an `http://` or `https://` URL (a `/health` or `/live`); exit 0 only on a 2xx answer.
    Http(HttpProbe),
}

/// `kvmesh probe grpc`.
#[derive(Args)]
pub struct GrpcProbe {
    /// `HOST:PORT` of the server.
    address: String,
    /// The service name to ask about; empty: the server as a whole.
    #[arg(long, default_value = "")]
    service: String,
    /// Seconds before the probe gives up.
    #[arg(long, default_value_t = 3.0)]
    timeout: f64,
    /// The mesh's TLS (`--tcp-tls-*`, or the `DYN_TCP_TLS_*` variables a container already has):
    /// with a CA the probe dials over TLS, with a client pair it presents it.
    #[command(flatten)]
    tls: TlsOpts,
}

/// `kvmesh probe http`.
#[derive(Args)]
pub struct HttpProbe {
    /// `http://HOST:PORT/PATH` or `https://HOST:PORT/PATH`.
    url: String,
    /// Seconds before the probe gives up.
    #[arg(long, default_value_t = 3.0)]
    timeout: f64,
    /// PEM CA that verifies an `https://` server (required for `https://`).
    #[arg(long)]
    ca_cert_path: Option<PathBuf>,
}

/// Runs the probe and exits: 0 healthy, 1 anything else (the reason on stderr).
pub async fn run(command: ProbeCommand) -> ! {
    let (timeout, probe) = match &command {
        ProbeCommand::Grpc(args) => (args.timeout, "grpc"),
        ProbeCommand::Http(args) => (args.timeout, "http"),
    };
    let checked = async {
        match command {
            ProbeCommand::Grpc(args) => grpc(*args).await,
            ProbeCommand::Http(args) => http(args).await,
        }
    };
    let outcome =
        match tokio::time::timeout(Duration::from_secs_f64(timeout.max(0.1)), checked).await {
            Ok(outcome) => outcome,
            Err(_) => Err(anyhow::anyhow!("no answer within {timeout} s")),
        };
    match outcome {
        Ok(status) => {
            println!("{status}");
            std::process::exit(0)
        }
        Err(error) => {
            eprintln!("{probe} probe: {error:#}");
            std::process::exit(1)
        }
    }
}

async fn grpc(args: GrpcProbe) -> anyhow::Result<String> {
    args.tls.check().map_err(anyhow::Error::msg)?;
    kvmesh_runtime::tls::mesh::install(args.tls.mesh_files()).map_err(anyhow::Error::msg)?;
    let channel = kvmesh_runtime::net::mesh_endpoint(
        &args.address,
        Duration::from_secs_f64(args.timeout.max(0.1)),
    )?
    .connect()
    .await?;
    let answer = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: args.service,
        })
        .await?
        .into_inner();
    let status = ServingStatus::try_from(answer.status).unwrap_or(ServingStatus::Unknown);
    match status {
        ServingStatus::Serving => Ok("SERVING".to_owned()),
        other => anyhow::bail!("{}", other.as_str_name()),
    }
}

async fn http(args: HttpProbe) -> anyhow::Result<String> {
    let uri: hyper::Uri = args.url.parse()?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => anyhow::bail!(
            "only http:// and https:// URLs are probed (got {})",
            args.url
        ),
    };
    let host = uri
        .host()
        .ok_or_else(|| anyhow::anyhow!("no host in {}", args.url))?;
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let address = format!("{host}:{port}");
    let path = uri.path_and_query().map_or("/", |path| path.as_str());
    let stream = tokio::net::TcpStream::connect(&address).await?;
    if !https {
        return get(stream, &address, path).await;
    }
    let ca = args
        .ca_cert_path
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("an https:// URL needs --ca-cert-path"))?;
    let config = kvmesh_runtime::tls::http1_client_config(ca, "--ca-cert-path")
        .map_err(anyhow::Error::msg)?;
    let name = tokio_rustls::rustls::pki_types::ServerName::try_from(
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
    )?;
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, stream)
        .await?;
    get(stream, &address, path).await
}

/// GET `path` over an open connection to `address`: the body of a 2xx answer, else an error.
async fn get<S>(stream: S, address: &str, path: &str) -> anyhow::Result<String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header("host", address)
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    let body = String::from_utf8_lossy(&body).trim().to_owned();
    if status.is_success() {
        Ok(body)
    } else {
        anyhow::bail!("{status}: {body}")
    }
}
