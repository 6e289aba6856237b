//! The client the router uses: fans a query out to one serving replica of every shard in
//! parallel, with a deadline and failover to another replica, and merges the answers. A shard
//! that does not answer contributes nothing; routing never fails because of the index.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use futures::StreamExt;
use kvmesh_kv::OverlapScores;
use kvmesh_proto::v1::indexer_client::IndexerClient as GrpcIndexerClient;
use kvmesh_proto::v1::{FindMatchesRequest, FindMatchesResponse, InstanceRecord};
use kvmesh_runtime::discovery::{Discovery, WatchEvent};
use kvmesh_runtime::names;
use tokio_util::sync::CancellationToken;

use crate::bootstrap::{INDEXER_COMPONENT, INDEXER_ENDPOINT, layout_of};
use crate::convert::scores_from_proto;
use crate::shard::ShardLayout;

/// The merged answer of every shard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergedMatches {
    /// Scores of every worker of every shard that answered.
    pub scores: OverlapScores,
    /// Partitions no replica answered for.
    pub missing_partitions: Vec<u32>,
}

#[derive(Clone)]
struct Replica {
    instance_id: u64,
    layout: ShardLayout,
    client: GrpcIndexerClient<tonic::transport::Channel>,
}

/// Fan-out client over the indexer replicas of one namespace, kept current from discovery.
#[derive(Clone)]
pub struct IndexerClient {
    inner: Arc<Inner>,
}

struct Inner {
    replicas: ArcSwap<Vec<Replica>>,
    num_partitions: u32,
    timeout: Duration,
    next: AtomicUsize,
    failures: AtomicU64,
    missing: AtomicU64,
}

impl IndexerClient {
    /// Watches `namespace`'s indexer replicas in discovery until `shutdown`.
    pub async fn connect(
        discovery: Arc<dyn Discovery>,
        namespace: &str,
        num_partitions: u32,
        timeout: Duration,
        shutdown: CancellationToken,
    ) -> anyhow::Result<Self> {
        let inner = Arc::new(Inner {
            replicas: ArcSwap::from_pointee(Vec::new()),
            num_partitions,
            timeout,
            next: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            missing: AtomicU64::new(0),
        });
        let prefix = format!(
            "{}{INDEXER_COMPONENT}/{INDEXER_ENDPOINT}/",
            names::instances_prefix(Some(namespace))
        );
        let mut watch = discovery.watch(&prefix).await?;
        let watcher = inner.clone();
        tokio::spawn(async move {
            let mut known: BTreeMap<String, Replica> = BTreeMap::new();
            loop {
                let event = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    event = watch.next() => event,
                };
                match event {
                    Some(WatchEvent::Put { key, value }) => {
                        match serde_json::from_slice::<InstanceRecord>(&value) {
                            Ok(record) => {
                                if let Some(replica) = replica_of(&record) {
                                    known.insert(key, replica);
                                }
                            }
                            Err(error) => {
                                tracing::warn!(%key, %error, "undecodable indexer record")
                            }
                        }
                    }
                    Some(WatchEvent::Delete { key }) => {
                        known.remove(&key);
                    }
                    None => return,
                }
                watcher
                    .replicas
                    .store(Arc::new(known.values().cloned().collect()));
            }
        });
        Ok(Self { inner })
    }

    /// Number of replicas currently known.
    pub fn num_replicas(&self) -> usize {
        self.inner.replicas.load().len()
    }

    /// Shard queries that failed on every replica tried (`kvmesh_router_indexer_query_failures_total`).
    pub fn num_failures(&self) -> u64 {
        self.inner.failures.load(Ordering::Relaxed)
    }

    /// Answers with some partitions missing.
    pub fn num_partial_answers(&self) -> u64 {
        self.inner.missing.load(Ordering::Relaxed)
    }

    /// Asks every shard in parallel and merges the answers.
    pub async fn find_matches(&self, model: &str, local_hashes: &[u64]) -> MergedMatches {
        let replicas = self.inner.replicas.load_full();
        let mut shards: BTreeMap<Vec<u32>, Vec<&Replica>> = BTreeMap::new();
        for replica in replicas.iter() {
            shards
                .entry(replica.layout.partitions.clone())
                .or_default()
                .push(replica);
        }
        let request = FindMatchesRequest {
            model: model.to_string(),
            local_hashes: local_hashes.to_vec(),
            ..Default::default()
        };
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let queries = shards
            .values()
            .map(|group| self.query_shard(group, start, request.clone()));
        let answers = futures::future::join_all(queries).await;
        let merged = merge_answers(answers.into_iter().flatten(), self.inner.num_partitions);
        if !merged.missing_partitions.is_empty() {
            self.inner.missing.fetch_add(1, Ordering::Relaxed);
        }
        merged
    }

    async fn query_shard(
        &self,
        group: &[&Replica],
        start: usize,
        request: FindMatchesRequest,
    ) -> Option<FindMatchesResponse> {
        for attempt in 0..group.len().min(2) {
            let replica = group[(start + attempt) % group.len()];
            let mut client = replica.client.clone();
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(self.inner.timeout);
            match tokio::time::timeout(self.inner.timeout, client.find_matches(call)).await {
                Ok(Ok(response)) => return Some(response.into_inner()),
                Ok(Err(status)) => {
                    tracing::debug!(replica = %format!("{:x}", replica.instance_id), %status, "indexer query failed")
                }
                Err(_) => {
                    tracing::debug!(replica = %format!("{:x}", replica.instance_id), "indexer query timed out")
                }
            }
        }
        self.inner.failures.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// Merges shard answers: shards own disjoint workers, so rows are a union and frequencies add up
/// element-wise; partitions no answer covers are reported missing.
pub fn merge_answers(
    answers: impl IntoIterator<Item = FindMatchesResponse>,
    num_partitions: u32,
) -> MergedMatches {
    let mut merged = MergedMatches::default();
    let mut covered = BTreeSet::new();
    for answer in answers {
        covered.extend(answer.partitions.iter().copied());
        let scores = scores_from_proto(&answer);
        merged.scores.scores.extend(scores.scores);
        let frequencies = &mut merged.scores.frequencies;
        if frequencies.len() < scores.frequencies.len() {
            frequencies.resize(scores.frequencies.len(), 0);
        }
        for (sum, count) in frequencies.iter_mut().zip(scores.frequencies) {
            *sum += count;
        }
    }
    merged.scores.scores.sort_by_key(|row| row.worker);
    merged.missing_partitions = (0..num_partitions)
        .filter(|p| !covered.contains(p))
        .collect();
    merged
}

fn replica_of(record: &InstanceRecord) -> Option<Replica> {
    let layout = layout_of(record)?;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", record.address))
        .ok()?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true);
    Some(Replica {
        instance_id: record.instance_id,
        layout,
        client: GrpcIndexerClient::new(endpoint.connect_lazy()),
    })
}
