//! Real `kvmesh-indexer` processes (two shards, two replicas each) fed by real `kvmesh-mocker`
//! processes through a real NATS JetStream, discovered through a real etcd. Kill a replica with
//! SIGKILL while events flow and queries run: no query loses a partition; restart it: it reaches
//! its peer's digest.
//!
//! Needs `ETCD_ENDPOINTS` and `NATS_SERVER` (scripts/test.sh starts both) and the workspace
//! binaries built (`cargo build --workspace --bins`). `KVMESH_SKIP_EXTERNAL=1` skips it.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use kvmesh_indexer::bootstrap::{layout_metadata, list_replicas};
use kvmesh_indexer::client::IndexerClient;
use kvmesh_indexer::shard::ShardLayout;
use kvmesh_proto::v1::indexer_client::IndexerClient as GrpcIndexerClient;
use kvmesh_proto::v1::worker_client::WorkerClient;
use kvmesh_proto::v1::{GenerateRequest, InstanceRecord, StatusRequest, StopConditions};
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::discovery::etcd::EtcdDiscovery;
use kvmesh_runtime::names;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

const MODEL: &str = "tiny";
const PARTITIONS: u32 = 4;
const BLOCK_SIZE: usize = 4;
/// Per-call deadline of the tests' fan-out clients.
const QUERY_DEADLINE: Duration = Duration::from_millis(300);

fn external() -> Option<(String, String)> {
    if std::env::var("KVMESH_SKIP_EXTERNAL").as_deref() == Ok("1") {
        eprintln!("skipping: KVMESH_SKIP_EXTERNAL=1");
        return None;
    }
    let etcd = std::env::var("ETCD_ENDPOINTS")
        .expect("ETCD_ENDPOINTS must point at a real etcd (scripts/test.sh starts one)");
    let nats = std::env::var("NATS_SERVER")
        .expect("NATS_SERVER must point at a real nats-server -js (scripts/test.sh starts one)");
    Some((etcd, nats))
}

fn bin(name: &str) -> PathBuf {
    let indexer = PathBuf::from(env!("CARGO_BIN_EXE_kvmesh-indexer"));
    let path = indexer.with_file_name(name);
    assert!(
        path.exists(),
        "{} is not built: run cargo build --workspace --bins",
        path.display()
    );
    path
}

fn spawn(name: &str, args: &[String], etcd: &str, nats: &str) -> Child {
    Command::new(bin(name))
        .args(args)
        .env("ETCD_ENDPOINTS", etcd)
        .env("NATS_SERVER", nats)
        .env("DYN_DISCOVERY_BACKEND", "etcd")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn")
}

fn indexer_args(namespace: &str, shard: u32) -> Vec<String> {
    sharded_args(namespace, shard, 2)
}

fn sharded_args(namespace: &str, shard: u32, shards: u32) -> Vec<String> {
    [
        "--namespace",
        namespace,
        "--kv-partitions",
        "4",
        "--indexer-shards",
        &shards.to_string(),
        "--indexer-shard",
        &shard.to_string(),
        "--router-event-threads",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Arguments of a `kvmesh-mocker` with `num_workers` workers of the tiny model in `namespace`
/// (small KV pools, so blocks are evicted and removal events flow too).
fn mocker_args(namespace: &str, num_workers: u32) -> Vec<String> {
    let model_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny");
    [
        "--model-path",
        model_path.to_str().expect("utf-8 path"),
        "--model-name",
        MODEL,
        "--endpoint",
        &format!("dyn://{namespace}.backend.generate"),
        "--block-size",
        &BLOCK_SIZE.to_string(),
        "--num-workers",
        &num_workers.to_string(),
        "--speedup-ratio",
        "50",
        "--kv-partitions",
        "4",
        "--num-gpu-blocks-override",
        "256",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

async fn wait_for<T>(what: &str, secs: u64, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// (shard, instance id, applied_seq, digest) of every reachable replica.
async fn statuses(discovery: &dyn Discovery, namespace: &str) -> Vec<(u32, u64, u64, u64)> {
    let mut out = Vec::new();
    for (record, layout) in list_replicas(discovery, namespace)
        .await
        .unwrap_or_default()
    {
        let Ok(endpoint) =
            tonic::transport::Endpoint::from_shared(format!("http://{}", record.address))
        else {
            continue;
        };
        let Ok(Ok(channel)) =
            tokio::time::timeout(Duration::from_millis(500), endpoint.connect()).await
        else {
            continue;
        };
        if let Ok(status) = GrpcIndexerClient::new(channel)
            .status(StatusRequest {})
            .await
        {
            let status = status.into_inner();
            let digest = status
                .models
                .iter()
                .map(|m| m.digest)
                .fold(0u64, u64::wrapping_add);
            out.push((layout.shard, record.instance_id, status.applied_seq, digest));
        }
    }
    out.sort_unstable();
    out
}

fn prompt(i: u64) -> Vec<u32> {
    // Four shared prefixes of 12 tokens, then a tail unique to the request.
    let mut tokens: Vec<u32> = (0..12).map(|t| 100 + (i % 4) as u32 * 50 + t).collect();
    tokens.extend((0..8).map(|t| 1000 + ((i * 7 + t) % 1500) as u32));
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_replicas_survive_sigkill_and_converge() {
    let Some((etcd, nats)) = external() else {
        return;
    };
    let namespace = format!("idx{:x}", std::process::id() as u64 ^ 0x5eed_0000);
    let endpoints = vec![etcd.clone()];
    let discovery: Arc<dyn Discovery> =
        Arc::new(EtcdDiscovery::connect(&endpoints).await.expect("etcd"));

    let mut replicas: Vec<Child> = (0..4)
        .map(|i| {
            spawn(
                "kvmesh-indexer",
                &indexer_args(&namespace, i / 2),
                &etcd,
                &nats,
            )
        })
        .collect();
    let mut mockers: Vec<Child> = (0..2)
        .map(|_| spawn("kvmesh-mocker", &mocker_args(&namespace, 3), &etcd, &nats))
        .collect();

    let worker_prefix = format!(
        "{}backend/generate/",
        names::instances_prefix(Some(&namespace))
    );
    let list_workers = async |count: usize| -> Vec<InstanceRecord> {
        wait_for(&format!("{count} mock workers"), 30, async || {
            let list = discovery.list(&worker_prefix).await.ok()?;
            (list.len() == count).then(|| {
                list.iter()
                    .filter_map(|kv| serde_json::from_slice(&kv.value).ok())
                    .collect()
            })
        })
        .await
    };
    let mut workers = list_workers(6).await;
    // Worker ids hash to partitions, so six workers can all land on one shard; both shards must
    // index someone for the convergence check to mean anything, so add workers until they do.
    let shards = [0, 1].map(|shard| ShardLayout::striped(shard, 2, PARTITIONS));
    while !shards
        .iter()
        .all(|shard| workers.iter().any(|w| shard.owns_worker(w.instance_id)))
    {
        assert!(workers.len() < 24, "worker ids keep landing on one shard");
        eprintln!(
            "all {} workers hash to one shard: adding one",
            workers.len()
        );
        mockers.push(spawn(
            "kvmesh-mocker",
            &mocker_args(&namespace, 1),
            &etcd,
            &nats,
        ));
        workers = list_workers(workers.len() + 1).await;
    }
    wait_for("4 serving replicas", 30, async || {
        (list_replicas(discovery.as_ref(), &namespace)
            .await
            .ok()?
            .len()
            == 4)
            .then_some(())
    })
    .await;

    let stop = CancellationToken::new();
    let client = IndexerClient::connect(
        discovery.clone(),
        &namespace,
        PARTITIONS,
        QUERY_DEADLINE,
        stop.clone(),
    )
    .await
    .expect("client");
    wait_for("client sees 4 replicas", 10, async || {
        (client.num_replicas() == 4).then_some(())
    })
    .await;

    // Traffic: requests with shared prefixes over all six workers.
    let traffic_on = Arc::new(AtomicBool::new(true));
    let sent = Arc::new(AtomicU64::new(0));
    let mut traffic = Vec::new();
    for (w, worker) in workers.iter().enumerate() {
        let address = format!("http://{}", worker.address);
        let on = traffic_on.clone();
        let sent = sent.clone();
        traffic.push(tokio::spawn(async move {
            let mut client = WorkerClient::connect(address).await.expect("worker");
            let mut i = w as u64;
            while on.load(Ordering::Relaxed) {
                let request = GenerateRequest {
                    request_id: format!("r{i}"),
                    model: MODEL.into(),
                    token_ids: prompt(i),
                    stop: Some(StopConditions {
                        max_tokens: Some(4),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                if let Ok(response) = client.generate(request).await {
                    let mut stream = response.into_inner();
                    while let Ok(Some(_)) = stream.message().await {}
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                i += 6;
            }
        }));
    }

    // Every worker's prefix shows up in the merged answer.
    let hashes =
        kvmesh_kv::compute_block_hashes(&prompt(0), BLOCK_SIZE, kvmesh_kv::hashing::BASE_SEED);
    wait_for("indexed prefixes", 30, async || {
        let answer = client.find_matches(MODEL, &hashes).await;
        (answer.missing_partitions.is_empty() && !answer.scores.scores.is_empty()).then_some(())
    })
    .await;

    // Queries keep running while a replica of shard 0 is killed: none may lose a partition.
    let incomplete = Arc::new(AtomicU64::new(0));
    let queries = Arc::new(AtomicU64::new(0));
    let querier = {
        let client = client.clone();
        let incomplete = incomplete.clone();
        let queries = queries.clone();
        let on = traffic_on.clone();
        let hashes = hashes.clone();
        tokio::spawn(async move {
            while on.load(Ordering::Relaxed) {
                let answer = client.find_matches(MODEL, &hashes).await;
                queries.fetch_add(1, Ordering::Relaxed);
                if !answer.missing_partitions.is_empty() {
                    incomplete.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas[0].start_kill().expect("sigkill");
    let _ = replicas[0].wait().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    replicas[0] = spawn("kvmesh-indexer", &indexer_args(&namespace, 0), &etcd, &nats);
    tokio::time::sleep(Duration::from_secs(2)).await;
    traffic_on.store(false, Ordering::Relaxed);
    for task in traffic {
        let _ = task.await;
    }
    let _ = querier.await;
    assert!(sent.load(Ordering::Relaxed) > 20, "traffic flowed");
    assert!(queries.load(Ordering::Relaxed) > 50, "queries ran");
    assert_eq!(
        incomplete.load(Ordering::Relaxed),
        0,
        "a query lost a shard while a replica died"
    );

    // The restarted replica converges to its peer: same applied sequence, same digest.
    let converged = wait_for("restarted replica converges", 20, async || {
        let all = statuses(discovery.as_ref(), &namespace).await;
        let shard0: Vec<_> = all.iter().filter(|s| s.0 == 0).collect();
        let shard1: Vec<_> = all.iter().filter(|s| s.0 == 1).collect();
        let agree = |group: &[&(u32, u64, u64, u64)]| {
            group.len() == 2
                && group[0].2 == group[1].2
                && group[0].3 == group[1].3
                && group[0].3 != 0
        };
        (agree(&shard0) && agree(&shard1)).then_some(all)
    })
    .await;
    assert_eq!(converged.len(), 4);
    stop.cancel();
}

/// A private `nats-server -js` on a fixed port and store, so the test can kill and restart it.
fn start_nats(port: u16, store: &std::path::Path) -> Child {
    Command::new("nats-server")
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nats-server must be installed (CI installs it)")
}

async fn wait_for_port(port: u16) {
    wait_for("nats-server listening", 20, async || {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(drop)
    })
    .await;
}

/// One request through a mock worker, so that its prompt's blocks are stored.
async fn generate(worker: &InstanceRecord, request_id: &str, tokens: Vec<u32>) {
    let mut client = WorkerClient::connect(format!("http://{}", worker.address))
        .await
        .expect("worker");
    let request = GenerateRequest {
        request_id: request_id.into(),
        model: MODEL.into(),
        token_ids: tokens,
        stop: Some(StopConditions {
            max_tokens: Some(2),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut stream = client
        .generate(request)
        .await
        .expect("generate")
        .into_inner();
    while let Ok(Some(_)) = stream.message().await {}
}

/// The NATS server restarts (its ephemeral consumers are gone): the replica keeps running, keeps
/// its state and its registration, and indexes the events published after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_resumes_when_nats_restarts() {
    let Some((etcd, _)) = external() else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    let store = std::env::temp_dir().join(format!("kvmesh-nats-restart-{}", std::process::id()));
    let mut nats_server = start_nats(port, &store);
    wait_for_port(port).await;
    let nats = format!("nats://127.0.0.1:{port}");
    let namespace = format!("rs{:x}", std::process::id() as u64 ^ 0x7e57_0000);
    let discovery: Arc<dyn Discovery> = Arc::new(
        EtcdDiscovery::connect(std::slice::from_ref(&etcd))
            .await
            .expect("etcd"),
    );

    let mut replica = spawn(
        "kvmesh-indexer",
        &sharded_args(&namespace, 0, 1),
        &etcd,
        &nats,
    );
    let _mocker = spawn("kvmesh-mocker", &mocker_args(&namespace, 1), &etcd, &nats);
    let worker_prefix = format!(
        "{}backend/generate/",
        names::instances_prefix(Some(&namespace))
    );
    let worker: InstanceRecord = wait_for("a mock worker", 30, async || {
        let list = discovery.list(&worker_prefix).await.ok()?;
        list.first()
            .and_then(|kv| serde_json::from_slice(&kv.value).ok())
    })
    .await;
    let registered = wait_for("a serving replica", 30, async || {
        let replicas = list_replicas(discovery.as_ref(), &namespace).await.ok()?;
        replicas.first().map(|(record, _)| record.instance_id)
    })
    .await;
    let stop = CancellationToken::new();
    let client = IndexerClient::connect(
        discovery.clone(),
        &namespace,
        PARTITIONS,
        QUERY_DEADLINE,
        stop.clone(),
    )
    .await
    .expect("client");
    let matched = async |tokens: &[u32]| {
        let hashes =
            kvmesh_kv::compute_block_hashes(tokens, BLOCK_SIZE, kvmesh_kv::hashing::BASE_SEED);
        let answer = client.find_matches(MODEL, &hashes).await;
        answer
            .scores
            .scores
            .iter()
            .map(|row| row.device)
            .max()
            .unwrap_or(0)
    };

    let before: Vec<u32> = (0..16).map(|t| 300 + t).collect();
    generate(&worker, "before", before.clone()).await;
    wait_for("the first prompt indexed", 20, async || {
        (matched(&before).await >= 3).then_some(())
    })
    .await;

    nats_server.start_kill().expect("sigkill nats-server");
    let _ = nats_server.wait().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _nats_server = start_nats(port, &store);
    wait_for_port(port).await;

    let after: Vec<u32> = (0..16).map(|t| 700 + t).collect();
    wait_for(
        "the prompt sent after the restart indexed",
        40,
        async || {
            generate(&worker, "after", after.clone()).await;
            (matched(&after).await >= 3).then_some(())
        },
    )
    .await;
    assert!(matched(&before).await >= 3, "the state from before stays");
    assert!(
        replica.try_wait().expect("replica status").is_none(),
        "the replica kept running"
    );
    let replicas = list_replicas(discovery.as_ref(), &namespace)
        .await
        .expect("list");
    assert_eq!(
        replicas
            .iter()
            .map(|(r, _)| r.instance_id)
            .collect::<Vec<_>>(),
        vec![registered],
        "the same registration serves"
    );
    stop.cancel();
    let _ = std::fs::remove_dir_all(&store);
}

/// A shard whose only registered peer gives no snapshot: the new replica waits for the peer instead
/// of starting empty beside it, and starts from the stream once the peer leaves discovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_waits_for_a_registered_peer_instead_of_starting_empty() {
    let Some((etcd, nats)) = external() else {
        return;
    };
    let namespace = format!("bw{:x}", std::process::id() as u64 ^ 0xb007_0000);
    let discovery: Arc<dyn Discovery> = Arc::new(
        EtcdDiscovery::connect(std::slice::from_ref(&etcd))
            .await
            .expect("etcd"),
    );
    // A peer registered under its own lease at an address where nothing listens.
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("free port")
        .port();
    let ghost_lease = EtcdDiscovery::connect(std::slice::from_ref(&etcd))
        .await
        .expect("etcd");
    let ghost = InstanceRecord {
        namespace: namespace.clone(),
        component: "indexer".into(),
        endpoint: "query".into(),
        instance_id: ghost_lease.instance_id(),
        address: format!("127.0.0.1:{closed_port}"),
        transport: "grpc".into(),
        metadata: layout_metadata(&ShardLayout::striped(0, 1, PARTITIONS)),
        ..Default::default()
    };
    ghost_lease
        .put(
            &names::instance_key(&namespace, "indexer", "query", ghost.instance_id),
            serde_json::to_vec(&ghost).expect("json").into(),
        )
        .await
        .expect("register the ghost");

    let mut replica = spawn(
        "kvmesh-indexer",
        &sharded_args(&namespace, 0, 1),
        &etcd,
        &nats,
    );
    let registered = async || {
        list_replicas(discovery.as_ref(), &namespace)
            .await
            .ok()?
            .into_iter()
            .find(|(record, _)| record.instance_id != ghost.instance_id)
            .map(|(record, _)| record.instance_id)
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(registered().await, None, "started beside a registered peer");
    assert!(
        replica.try_wait().expect("replica status").is_none(),
        "the replica keeps asking"
    );
    ghost_lease.revoke().await.expect("revoke the ghost");
    wait_for("the replica serving once the peer is gone", 20, registered).await;
}
