//! Starting processor hosts: the child a frontend starts for itself (`--spawn-processor-host`),
//! with the frontend options it needs, and the wait for the hosts a frontend's chat processor
//! or route extensions need before it serves.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use kvmesh_runtime::config::{DiscoveryBackend, RuntimeOpts};
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::lifecycle::ServiceLifecycle;
use tokio_util::sync::CancellationToken;

use super::{DEFAULT_NAMESPACE, ProcessorHosts, RouteExtensions};
use crate::opts::FrontendArgs;

/// Set in a host's environment by the frontend that started it: the host stops when its
/// standard input closes (the frontend is gone).
pub const PARENT_PIPE_ENV: &str = "KVMESH_PROCESSOR_HOST_PARENT_PIPE";

/// Starts a `kvmesh-processor-host` child with this process's own frontend options (so its
/// `config` is this frontend's), binding an ephemeral port and registering in the discovery
/// `runtime` names. The returned task ends when the child does (an error) or stops it when `stop`
/// fires; the child also ends when this process does.
pub fn spawn_host(
    runtime: &RuntimeOpts,
    stop: CancellationToken,
) -> anyhow::Result<impl std::future::Future<Output = anyhow::Result<()>> + use<>> {
    let binary = std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name("kvmesh-processor-host"))
        .filter(|path| path.exists())
        .unwrap_or_else(|| std::path::PathBuf::from("kvmesh-processor-host"));
    let mut args = host_args(std::env::args_os().skip(1));
    args.extend(host_settings(runtime));
    let mut child = tokio::process::Command::new(&binary)
        .args(args)
        .env(PARENT_PIPE_ENV, "1")
        .stdin(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("start {}: {e}", binary.display()))?;
    tracing::info!(pid = child.id(), "processor host started");
    // `wait` would close the child's stdin first: the pipe is held here until the child ends.
    let stdin = child.stdin.take();
    Ok(async move {
        tokio::select! {
            status = child.wait() => anyhow::bail!("the processor host exited ({})", status?),
            () = stop.cancelled() => {}
        }
        // Closing its input stops the host, which drains and unregisters.
        drop(stdin);
        let _ = tokio::time::timeout(Duration::from_secs(2), child.wait()).await;
        Ok(())
    })
}

/// The processor hosts this frontend needs, ready to serve: those of its custom chat processor
/// (`--dyn-chat-processor`), and the route extensions (`--frontend-route-extension`) with the
/// paths they serve. With `--spawn-processor-host` the frontend starts a host and waits for it;
/// route extensions also wait for a host to list its routes. A host that cannot start, or paths
/// the frontend serves itself, stop the frontend (exit 2) naming the option.
pub async fn connect_hosts(
    args: &FrontendArgs,
    runtime: &RuntimeOpts,
    metrics: &crate::metrics::FrontendMetrics,
    discovery: Arc<dyn Discovery>,
    lifecycle: &mut ServiceLifecycle,
    shutdown: &CancellationToken,
) -> anyhow::Result<(Option<ProcessorHosts>, Option<RouteExtensions>)> {
    let chat = &args.chat;
    let custom = chat.custom_processor();
    let extensions = !chat.frontend_route_extensions.is_empty();
    if custom.is_none() && !extensions {
        return Ok((None, None));
    }
    let option = if custom.is_some() {
        "--dyn-chat-processor (DYN_CHAT_PROCESSOR)"
    } else {
        "--frontend-route-extension (DYN_FRONTEND_ROUTE_EXTENSIONS)"
    };
    if chat.interactive() || args.kserve.grpc_server() {
        kvmesh_runtime::config::exit_config_error(&format!(
            "{option}: chat processors and route extensions serve only the HTTP edge, not --interactive or --kserve-grpc-server"
        ));
    }
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
    let hosts = ProcessorHosts::watch(
        discovery,
        &namespace,
        &chat.dyn_chat_processor,
        metrics.processor_requests.clone(),
        lifecycle.stop_token(),
    )
    .await?;
    if chat.spawn_processor_host {
        if runtime.discovery_backend == DiscoveryBackend::Mem {
            kvmesh_runtime::config::exit_config_error(&format!(
                "{option}: a processor host is a separate process and cannot see in-memory discovery; use --discovery-backend etcd or file"
            ));
        }
        lifecycle.spawn(spawn_host(runtime, lifecycle.stop_token())?);
        if let Err(error) = lifecycle.wait_ready(shutdown, || !hosts.is_empty()).await {
            kvmesh_runtime::config::exit_config_error(&format!(
                "{option}: the processor host did not start: {error}"
            ));
        }
    }
    let routes = if extensions {
        let anthropic = chat.anthropic_api();
        Some(RouteExtensions::load(hosts.clone(), anthropic, HOST_WAIT, shutdown).await)
    } else {
        None
    };
    Ok((custom.map(|_| hosts), routes))
}

/// How long route extensions wait for a host to list them.
const HOST_WAIT: Duration = Duration::from_secs(60);

/// Options the spawned host gets from this process rather than from its arguments: the
/// discovery it uses (`kvmesh up` swaps its in-memory discovery for a private file store when it
/// starts a host) and an ephemeral port of its own.
const SET_FOR_THE_HOST: [&str; 4] = [
    "--discovery-backend",
    "--file-kv",
    "--etcd-endpoints",
    "--tcp-rpc-port",
];

/// The discovery this process uses and an ephemeral port, as host arguments.
fn host_settings(runtime: &RuntimeOpts) -> Vec<OsString> {
    let backend = clap::ValueEnum::to_possible_value(&runtime.discovery_backend)
        .map(|value| value.get_name().to_owned())
        .unwrap_or_default();
    vec![
        "--discovery-backend".into(),
        backend.into(),
        "--file-kv".into(),
        runtime.file_kv_root().into_os_string(),
        "--etcd-endpoints".into(),
        runtime.etcd_endpoints.join(",").into(),
        "--tcp-rpc-port".into(),
        "0".into(),
    ]
}

/// The frontend options among `argv` (a `kvmesh-frontend` or `kvmesh up` command line, without
/// the program name): the `up` subcommand, the mock engine's options and [`SET_FOR_THE_HOST`]
/// are left out, everything the host's frontend options know is kept as given.
fn host_args(argv: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let command = <crate::FrontendOpts as clap::CommandFactory>::command();
    let takes_value = |name: &str| -> Option<bool> {
        command
            .get_arguments()
            .find(|arg| {
                let long = name.strip_prefix("--");
                let short = name.strip_prefix('-').filter(|s| s.len() == 1);
                long.is_some_and(|long| {
                    arg.get_long() == Some(long)
                        || arg.get_all_aliases().is_some_and(|a| a.contains(&long))
                }) || short.is_some_and(|short| {
                    arg.get_short().map(String::from).as_deref() == Some(short)
                })
            })
            .map(|arg| arg.get_action().takes_values())
    };
    let mut kept = Vec::new();
    let mut tokens = argv.into_iter().peekable();
    let mut first = true;
    while let Some(token) = tokens.next() {
        let text = token.to_string_lossy().into_owned();
        if std::mem::take(&mut first) && text == "up" {
            continue;
        }
        let (name, inline_value) = match text.split_once('=') {
            Some((name, _)) => (name.to_owned(), true),
            None => (text.clone(), false),
        };
        let known = takes_value(&name).filter(|_| !SET_FOR_THE_HOST.contains(&name.as_str()));
        let next_is_value = !inline_value
            && tokens
                .peek()
                .is_some_and(|next| !next.to_string_lossy().starts_with('-'));
        match known {
            Some(takes_value) => {
                kept.push(token);
                if takes_value && next_is_value {
                    kept.extend(tokens.next());
                }
            }
            None => {
                if next_is_value {
                    tokens.next();
                }
            }
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_kvmesh_up_command_line_keeps_only_frontend_options() {
        let kept = host_args(args(&[
            "up",
            "--num-workers",
            "2",
            "--dyn-chat-processor",
            "mod:fn",
            "--speedup-ratio=100",
            "--http-port",
            "8123",
            "--discovery-backend",
            "mem",
            "--enable-anthropic-api",
            "-i",
        ]));
        assert_eq!(
            kept,
            args(&[
                "--dyn-chat-processor",
                "mod:fn",
                "--http-port",
                "8123",
                "--enable-anthropic-api",
                "-i"
            ])
        );
    }

    #[test]
    fn a_frontend_command_line_is_kept_but_for_discovery() {
        let line = [
            "--dyn-chat-processor=seed",
            "--namespace",
            "ns",
            "--file-kv",
            "/x",
            "--tcp-rpc-port=9000",
        ];
        assert_eq!(
            host_args(args(&line)),
            args(&["--dyn-chat-processor=seed", "--namespace", "ns"])
        );
    }

    #[test]
    fn the_mesh_tls_flags_reach_the_host() {
        let line = [
            "--tcp-tls-cert-path",
            "/m/tls.crt",
            "--tcp-tls-key-path=/m/tls.key",
            "--tcp-tls-ca-cert-path",
            "/m/ca.pem",
            "--tcp-tls-client-ca-cert-path",
            "/m/ca.pem",
            "--tcp-tls-client-cert-path",
            "/m/tls.crt",
            "--tcp-tls-client-key-path",
            "/m/tls.key",
            "--nats-tls-ca-cert-path",
            "/n/ca.pem",
            "--etcd-tls-ca-cert-path",
            "/e/ca.pem",
        ];
        assert_eq!(host_args(args(&line)), args(&line));
    }
}
