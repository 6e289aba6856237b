//! The whole mesh as tasks in one process, for integration tests of the request path: frontends,
//! router replicas, indexer shards with replicas and mock workers, each started from its real
//! `run` with the flags a user would give it, on one in-memory discovery store and event plane.
//! Mock workers serve gRPC on loopback (as separate processes do), so the worker connections,
//! the seam and migration are the production code. Every service can be killed (its task
//! aborted, its discovery records left behind as a dead process leaves them until its lease
//! expires), stopped gracefully, and restarted (under a new instance id).
//!
//! A change to routing can be tested here without building the binaries; the tests that need a
//! real process death (a SIGKILL breaks connections in ways an aborted task does not) and real
//! etcd and NATS stay in `tests/python`.

mod client;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kvmesh_runtime::connect::Embedded;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use self::client::{StreamOutcome, get, stream_chat, stream_chat_slowly};

/// How to start one kind of service: its name and the flags it is started with.
type Launcher = Box<dyn Fn(Embedded, CancellationToken) -> JoinHandle<anyhow::Result<()>> + Send>;

/// One service of the mesh, running or not.
pub struct ServiceHandle {
    name: String,
    embedded: Embedded,
    launch: Launcher,
    running: Option<(JoinHandle<anyhow::Result<()>>, CancellationToken)>,
}

impl ServiceHandle {
    fn new(name: String, embedded: Embedded, launch: Launcher) -> Self {
        let mut handle = Self {
            name,
            embedded,
            launch,
            running: None,
        };
        handle.restart();
        handle
    }

    /// The service's name in this mesh (`worker-0`, `router-1`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether its task is still running.
    pub fn is_running(&self) -> bool {
        self.running
            .as_ref()
            .is_some_and(|(task, _)| !task.is_finished())
    }

    /// Kills it: the task is aborted mid-flight, nothing is unregistered or drained, and its
    /// connections close.
    pub fn kill(&mut self) {
        if let Some((task, _)) = self.running.take() {
            task.abort();
        }
    }

    /// Stops it as a signal would: unregister, drain, stop. Returns its outcome.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        let Some((task, shutdown)) = self.running.take() else {
            return Ok(());
        };
        shutdown.cancel();
        task.await?
    }

    /// Starts it again (a killed or stopped service comes back under a new instance id).
    pub fn restart(&mut self) {
        self.kill();
        let shutdown = CancellationToken::new();
        let task = (self.launch)(self.embedded.clone(), shutdown.clone());
        self.running = Some((task, shutdown));
    }
}

impl Drop for ServiceHandle {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What to start. Flags are the services' own command-line flags.
#[derive(Debug, Clone)]
pub struct MeshBuilder {
    namespace: String,
    num_workers: usize,
    worker_args: Vec<String>,
    frontend_args: Vec<String>,
    num_routers: usize,
    router_args: Vec<String>,
    indexer_shards: u32,
    indexer_replicas: usize,
}

impl Default for MeshBuilder {
    fn default() -> Self {
        Self {
            namespace: "harness".into(),
            num_workers: 2,
            worker_args: Vec::new(),
            frontend_args: Vec::new(),
            num_routers: 0,
            router_args: Vec::new(),
            indexer_shards: 0,
            indexer_replicas: 1,
        }
    }
}

fn strings<I: IntoIterator<Item = S>, S: Into<String>>(args: I) -> Vec<String> {
    args.into_iter().map(Into::into).collect()
}

impl MeshBuilder {
    /// `num` mock workers (default 2), each one `kvmesh-mocker` with one worker.
    pub fn workers(mut self, num: usize) -> Self {
        self.num_workers = num;
        self
    }

    /// Extra `kvmesh-mocker` flags of every worker (e.g. `--speedup-ratio 1`).
    pub fn worker_args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.worker_args = strings(args);
        self
    }

    /// Extra `kvmesh-frontend` flags (e.g. `--migration-limit 3`).
    pub fn frontend_args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.frontend_args = strings(args);
        self
    }

    /// `num` `kvmesh-router` replicas with these extra flags; the frontend routes through them.
    pub fn routers<I: IntoIterator<Item = S>, S: Into<String>>(
        mut self,
        num: usize,
        args: I,
    ) -> Self {
        self.num_routers = num;
        self.router_args = strings(args);
        self
    }

    /// `shards` indexer shards with `replicas` replicas each.
    pub fn indexers(mut self, shards: u32, replicas: usize) -> Self {
        self.indexer_shards = shards;
        self.indexer_replicas = replicas;
        self
    }

    /// Starts everything and waits until the frontend lists the model with every worker.
    pub async fn start(self) -> anyhow::Result<Mesh> {
        let embedded = Embedded {
            grpc_workers: true,
            ..Embedded::new()
        };
        let namespace = self.namespace.clone();
        let model_path = tiny_model();
        let mut indexers = Vec::new();
        for shard in 0..self.indexer_shards {
            for replica in 0..self.indexer_replicas {
                let args = [
                    "kvmesh-indexer".to_string(),
                    "--discovery-backend".into(),
                    "mem".into(),
                    "--namespace".into(),
                    namespace.clone(),
                    "--indexer-shards".into(),
                    self.indexer_shards.to_string(),
                    "--indexer-shard".into(),
                    shard.to_string(),
                    "--tcp-rpc-host".into(),
                    "127.0.0.1".into(),
                ];
                let opts = kvmesh_indexer::IndexerOpts::try_parse_from(args)?;
                indexers.push(ServiceHandle::new(
                    format!("indexer-{shard}-{replica}"),
                    embedded.clone(),
                    Box::new(move |embedded, shutdown| {
                        tokio::spawn(kvmesh_indexer::run(opts.clone(), Some(embedded), shutdown))
                    }),
                ));
            }
        }
        let mut routers = Vec::new();
        for index in 0..self.num_routers {
            let mut args = strings([
                "kvmesh-router",
                "--discovery-backend",
                "mem",
                "--tcp-rpc-host",
                "127.0.0.1",
            ]);
            args.extend(["--namespace".into(), namespace.clone()]);
            args.extend(self.router_args.iter().cloned());
            let opts = kvmesh_router::server::RouterServiceOpts::try_parse_from(args)?;
            routers.push(ServiceHandle::new(
                format!("router-{index}"),
                embedded.clone(),
                Box::new(move |embedded, shutdown| {
                    tokio::spawn(kvmesh_router::server::run(
                        opts.clone(),
                        Some(embedded),
                        shutdown,
                    ))
                }),
            ));
        }
        let mut workers = Vec::new();
        for index in 0..self.num_workers {
            let mut args = strings([
                "kvmesh-mocker",
                "--discovery-backend",
                "mem",
                "--model-name",
                "tiny",
                "--tcp-rpc-host",
                "127.0.0.1",
            ]);
            args.extend(["--model-path".into(), model_path.display().to_string()]);
            args.extend([
                "--endpoint".into(),
                format!("dyn://{namespace}.backend.generate"),
            ]);
            args.extend(self.worker_args.iter().cloned());
            let opts = kvmesh_mocker::MockerOpts::try_parse_from(args)?;
            workers.push(ServiceHandle::new(
                format!("worker-{index}"),
                embedded.clone(),
                Box::new(move |embedded, shutdown| {
                    tokio::spawn(kvmesh_mocker::run(opts.clone(), Some(embedded), shutdown))
                }),
            ));
        }
        let port = free_port()?;
        let mut args = strings([
            "kvmesh-frontend",
            "--discovery-backend",
            "mem",
            "--http-host",
            "127.0.0.1",
        ]);
        args.extend(["--http-port".into(), port.to_string()]);
        args.extend(["--namespace".into(), namespace.clone()]);
        if self.num_routers > 0 {
            args.extend(strings(["--use-remote-router", "on"]));
        }
        args.extend(self.frontend_args.iter().cloned());
        let opts = kvmesh_frontend::FrontendOpts::try_parse_from(args)?;
        let frontend = ServiceHandle::new(
            "frontend".into(),
            embedded.clone(),
            Box::new(move |embedded, shutdown| {
                tokio::spawn(kvmesh_frontend::run(opts.clone(), Some(embedded), shutdown))
            }),
        );
        let mesh = Mesh {
            base_url: format!("http://127.0.0.1:{port}"),
            frontend,
            workers,
            routers,
            indexers,
        };
        mesh.wait_for_workers(self.num_workers).await?;
        Ok(mesh)
    }
}

/// A running mesh. Dropping it kills every service.
pub struct Mesh {
    /// `http://127.0.0.1:{port}` of the frontend.
    pub base_url: String,
    /// The frontend.
    pub frontend: ServiceHandle,
    /// The mock workers, one worker each.
    pub workers: Vec<ServiceHandle>,
    /// The router replicas.
    pub routers: Vec<ServiceHandle>,
    /// The indexer replicas, shard by shard.
    pub indexers: Vec<ServiceHandle>,
}

impl Mesh {
    /// What to start.
    pub fn builder() -> MeshBuilder {
        MeshBuilder::default()
    }

    /// Waits (up to 30 s) until the frontend's `/health` counts `num` worker instances of `tiny`.
    pub async fn wait_for_workers(&self, num: usize) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, body)) = get(&self.base_url, "/health").await
                && let Ok(health) = serde_json::from_str::<serde_json::Value>(&body)
                && health["num_instances"].as_u64().unwrap_or(0) >= num as u64
                && health["models"]
                    .as_array()
                    .is_some_and(|models| models.iter().any(|m| m == "tiny"))
            {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("the frontend never listed {num} workers of tiny");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The value of one Prometheus series of the frontend's `/metrics`, summed over every
    /// series whose name and labels start with `prefix`.
    pub async fn metric_sum(&self, prefix: &str) -> anyhow::Result<f64> {
        let (_, text) = get(&self.base_url, "/metrics").await?;
        Ok(text
            .lines()
            .filter(|line| line.starts_with(prefix))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

/// The bundled model of the repository.
fn tiny_model() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny"))
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}
