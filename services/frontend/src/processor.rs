//! Chat requests served by a Python chat processor (`--dyn-chat-processor`): the frontend finds
//! the live processor hosts of its namespace in discovery, sends each chat request for a
//! token-input model to one of them over `kvmesh.v1.ChatProcessor`, routes and generates the
//! preprocessed requests the processor sends back through the model's own routing seam, and
//! turns the processor's chunks into the text deltas every chat-family framer reads
//! (docs/processors.md).

/// Discovery component of processor hosts.
pub const PROCESSOR_COMPONENT: &str = "processor";
/// Discovery endpoint of processor hosts.
pub const PROCESSOR_ENDPOINT: &str = "process";
/// Instance metadata key naming the processor a host runs.
pub const PROCESSOR_METADATA: &str = "processor";
/// Where hosts register when `--namespace` is unset, and where the frontend then looks.
pub const DEFAULT_NAMESPACE: &str = "dynamo";

mod session;

use std::ffi::OsString;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kvmesh_proto::v1::chat_processor_client::ChatProcessorClient;
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::discovery::instances::InstanceList;
use kvmesh_runtime::{names, net};
use tokio_util::sync::CancellationToken;

pub(crate) use self::session::{ProcessorRequest, start};

/// How long connecting to a host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
struct Host {
    instance_id: u64,
    client: ChatProcessorClient<tonic::transport::Channel>,
}

/// The live hosts of one processor in one namespace, kept current from discovery; requests go
/// round-robin over them. Cloning is cheap.
#[derive(Clone)]
pub struct ProcessorHosts {
    processor: String,
    hosts: InstanceList<Host>,
    next: Arc<AtomicUsize>,
}

impl ProcessorHosts {
    /// Watches the hosts of `processor` registered in `namespace` until `shutdown`.
    pub async fn watch(
        discovery: Arc<dyn Discovery>,
        namespace: &str,
        processor: &str,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let prefix = format!(
            "{}{PROCESSOR_COMPONENT}/{PROCESSOR_ENDPOINT}/",
            names::instances_prefix(Some(namespace))
        );
        let wanted = processor.to_owned();
        let hosts = InstanceList::watch(
            discovery.as_ref(),
            &prefix,
            "processor host",
            move |record| {
                if record.metadata.get(PROCESSOR_METADATA) != Some(&wanted) {
                    return None;
                }
                let channel = net::mesh_endpoint(&record.address, CONNECT_TIMEOUT)
                    .ok()?
                    .connect_lazy();
                Some(Host {
                    instance_id: record.instance_id,
                    client: ChatProcessorClient::new(channel),
                })
            },
            shutdown,
        )
        .await?;
        Ok(Self {
            processor: processor.to_owned(),
            hosts,
            next: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The processor's name.
    pub fn processor(&self) -> &str {
        &self.processor
    }

    /// Hosts live now.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether no host is live.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The next host in turn, if any is live.
    fn pick(&self) -> Option<Host> {
        let hosts = self.hosts.load();
        if hosts.is_empty() {
            return None;
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed);
        Some(hosts[turn % hosts.len()].clone())
    }
}

/// Set in a host's environment by the frontend that started it: the host stops when its
/// standard input closes (the frontend is gone).
pub const PARENT_PIPE_ENV: &str = "KVMESH_PROCESSOR_HOST_PARENT_PIPE";

/// Starts a `kvmesh-processor-host` child with this process's own frontend options (so its
/// `config` is this frontend's), binding an ephemeral port and registering in the discovery
/// `runtime` names. The returned task ends when the child does (an error) or stops it when `stop`
/// fires; the child also ends when this process does.
pub fn spawn_host(
    runtime: &kvmesh_runtime::config::RuntimeOpts,
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
fn host_settings(runtime: &kvmesh_runtime::config::RuntimeOpts) -> Vec<OsString> {
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
}
