//! Indexer replicas in one process over the in-memory discovery and event plane: bootstrap from a
//! peer, failover in the client, removal markers, gaps. The same code runs against NATS and etcd
//! in `tests/real_processes.rs`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use kvmesh_indexer::bootstrap::list_replicas;
use kvmesh_indexer::client::IndexerClient;
use kvmesh_indexer::{IndexerOpts, run};
use kvmesh_proto::v1::indexer_client::IndexerClient as GrpcIndexerClient;
use kvmesh_proto::v1::{
    KvEvent, KvEventBatch, KvStored, KvStoredBlock, StatusRequest, StatusResponse, kv_event,
};
use kvmesh_runtime::connect::Embedded;
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::discovery::mem::MemDiscovery;
use kvmesh_runtime::event_plane::EventPlane;
use kvmesh_runtime::names;
use prost::Message;
use tokio_util::sync::CancellationToken;

const NS: &str = "idx-test";
const MODEL: &str = "tiny";
const PARTITIONS: u32 = 4;

fn opts(extra: &[&str]) -> IndexerOpts {
    let mut args = vec![
        "kvmesh-indexer",
        "--discovery-backend",
        "mem",
        "--namespace",
        NS,
        "--kv-partitions",
        "4",
        "--router-event-threads",
        "2",
        "--sweep-secs",
        "3600",
    ];
    args.extend_from_slice(extra);
    IndexerOpts::try_parse_from(args).expect("valid options")
}

fn stored(event_id: u64, parent: Option<u64>, hashes: &[u64]) -> KvEvent {
    KvEvent {
        event_id,
        tier: 0,
        kind: Some(kv_event::Kind::Stored(KvStored {
            parent_hash: parent,
            blocks: hashes
                .iter()
                .map(|h| KvStoredBlock {
                    block_hash: h + 1000,
                    tokens_hash: *h,
                    mm_hashes: vec![],
                })
                .collect(),
            start_position: None,
        })),
    }
}

async fn publish(events: &dyn EventPlane, worker_id: u64, batch_events: Vec<KvEvent>) {
    let first = batch_events.first().map(|e| e.event_id).unwrap_or(0);
    let batch = KvEventBatch {
        worker_id,
        dp_rank: 0,
        events: batch_events,
        published_at_ms: 0,
        worker_removed: false,
        worker_readmitted: false,
    };
    let subject = names::kv_subject(NS, MODEL, kvmesh_kv::kv_partition(worker_id, PARTITIONS));
    events
        .publish_durable(
            &subject,
            &format!("{worker_id:016x}-0-{first}"),
            Bytes::from(batch.encode_to_vec()),
        )
        .await
        .expect("publish");
}

async fn wait_for<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn statuses(discovery: &dyn Discovery) -> Vec<StatusResponse> {
    let mut out = Vec::new();
    for (record, _) in list_replicas(discovery, NS).await.expect("list") {
        let Ok(channel) =
            tonic::transport::Endpoint::from_shared(format!("http://{}", record.address))
                .expect("uri")
                .connect()
                .await
        else {
            continue;
        };
        if let Ok(status) = GrpcIndexerClient::new(channel)
            .status(StatusRequest {})
            .await
        {
            out.push(status.into_inner());
        }
    }
    out
}

async fn register_worker(discovery: &dyn Discovery, worker_id: u64) -> String {
    let key = names::instance_key(NS, "backend", "generate", worker_id);
    discovery
        .put(&key, Bytes::from_static(b"{}"))
        .await
        .expect("put");
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_bootstrap_fail_over_and_drop_removed_workers() {
    let embedded = Embedded::new();
    let workers_discovery = MemDiscovery::new(&embedded.store);
    let events = embedded.events.clone();
    // Worker 1 and 2 hold chains [10, 11, 12] and [10, 20].
    let worker_keys = [
        register_worker(&workers_discovery, 1).await,
        register_worker(&workers_discovery, 2).await,
    ];
    let first = CancellationToken::new();
    let replica_a = tokio::spawn(run(opts(&[]), Some(embedded.clone()), first.clone()));
    let observer = MemDiscovery::new(&embedded.store);
    wait_for("first replica", async || {
        (list_replicas(&observer, NS).await.ok()?.len() == 1).then_some(())
    })
    .await;
    publish(events.as_ref(), 1, vec![stored(0, None, &[10, 11, 12])]).await;
    publish(events.as_ref(), 2, vec![stored(0, None, &[10, 20])]).await;

    let client_stop = CancellationToken::new();
    let client = IndexerClient::connect(
        std::sync::Arc::new(MemDiscovery::new(&embedded.store)),
        NS,
        PARTITIONS,
        Duration::from_millis(500),
        client_stop.clone(),
    )
    .await
    .expect("client");
    let answer = wait_for("both workers indexed", async || {
        let answer = client.find_matches(MODEL, &[10, 11, 12]).await;
        (answer.scores.scores.len() == 2).then_some(answer)
    })
    .await;
    assert!(answer.missing_partitions.is_empty());
    let device: Vec<(u64, u32)> = answer
        .scores
        .scores
        .iter()
        .map(|row| (row.worker.worker_id, row.device))
        .collect();
    assert_eq!(device, vec![(1, 3), (2, 1)]);
    assert_eq!(answer.scores.frequencies, vec![2, 1, 1]);

    // A second replica bootstraps from the first and reaches the same digest.
    let second = CancellationToken::new();
    let replica_b = tokio::spawn(run(opts(&[]), Some(embedded.clone()), second.clone()));
    let digests = wait_for("equal digests", async || {
        let statuses = statuses(&observer).await;
        let digests: Vec<u64> = statuses
            .iter()
            .filter_map(|s| s.models.first().map(|m| m.digest))
            .collect();
        (digests.len() == 2 && digests[0] == digests[1]).then_some(digests)
    })
    .await;
    assert_ne!(digests[0], 0);

    // Stop the first replica: the client fails over and every query stays complete.
    first.cancel();
    replica_a.await.expect("join").expect("clean stop");
    publish(events.as_ref(), 1, vec![stored(1, Some(1012), &[13])]).await;
    wait_for("failover answers with new blocks", async || {
        let answer = client.find_matches(MODEL, &[10, 11, 12, 13]).await;
        assert!(
            answer.missing_partitions.is_empty(),
            "a query lost partitions"
        );
        (answer.scores.device(kvmesh_kv::WorkerKey::new(1, 0)) == 4).then_some(())
    })
    .await;

    // A gap in worker 2's event ids is counted and the later event still applies.
    publish(events.as_ref(), 2, vec![stored(5, Some(1020), &[21])]).await;
    wait_for("gap counted and applied", async || {
        let status = statuses(&observer).await.into_iter().next()?;
        let answer = client.find_matches(MODEL, &[10, 20, 21]).await;
        (status.counters.get("gaps").copied().unwrap_or(0) >= 1
            && answer.scores.device(kvmesh_kv::WorkerKey::new(2, 0)) == 3)
            .then_some(())
    })
    .await;

    // Worker 1 leaves discovery: the marker removes it from every answer.
    workers_discovery
        .delete(&worker_keys[0])
        .await
        .expect("delete");
    wait_for("worker 1 removed", async || {
        let answer = client.find_matches(MODEL, &[10, 11, 12]).await;
        (answer.scores.get(kvmesh_kv::WorkerKey::new(1, 0)).is_none()
            && answer.scores.get(kvmesh_kv::WorkerKey::new(2, 0)).is_some())
        .then_some(())
    })
    .await;

    second.cancel();
    client_stop.cancel();
    replica_b.await.expect("join").expect("clean stop");
}
