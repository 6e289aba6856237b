//! The client the router uses: fans a query out to one serving replica of every shard in
//! parallel, with a deadline and failover to another replica, and merges the answers. A replica
//! that runs in this process is called directly, with no gRPC in between. A shard
//! that does not answer contributes nothing; routing never fails because of the index.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt as _;
use kvmesh_kv::OverlapScores;
use kvmesh_proto::v1::indexer_client::IndexerClient as GrpcIndexerClient;
use kvmesh_proto::v1::{FindMatchesRequest, FindMatchesResponse, InstanceRecord};
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::discovery::instances::InstanceList;
use kvmesh_runtime::names;
use kvmesh_runtime::stream_client::{
    Answers, Incoming, StreamClient, StreamProtocol, StreamSettings,
};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::bootstrap::{INDEXER_COMPONENT, INDEXER_ENDPOINT, layout_of};
use crate::convert::scores_from_proto;
use crate::shard::ShardLayout;
use kvmesh_runtime::ErrorCode;
use kvmesh_runtime::GrpcErrorCode as _;

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
    link: ReplicaLink,
}

/// How queries reach a replica.
#[derive(Clone)]
enum ReplicaLink {
    /// Over gRPC, on one long-lived query stream.
    Grpc(QueryStream),
    /// By a direct call: the replica (this instance id) runs in this process. It is looked up
    /// per query, so a replica that stopped answers as unavailable, as a dead process would.
    InProcess(u64),
}

impl ReplicaLink {
    async fn query(&self, request: FindMatchesRequest) -> Answer {
        match self {
            ReplicaLink::Grpc(queries) => queries.call(request).await,
            ReplicaLink::InProcess(instance_id) => match crate::local::lookup(*instance_id) {
                Some(service) => service.answer_in_process(request),
                None => Err(ErrorCode::Unavailable.to_status("indexer replica stopped")),
            },
        }
    }
}

/// An answer to one query, or why there is none.
type Answer = Result<FindMatchesResponse, tonic::Status>;

/// One long-lived `FindMatchesStream` to a replica, shared by concurrent callers: queries go out
/// in order and answers come back in the same order, so each is matched to its caller without
/// ids. Saves the HTTP/2 stream setup a unary call pays per query (docs/benchmarks.md has the
/// difference).
type QueryStream = StreamClient<FindMatches>;

/// The `FindMatchesStream` protocol: answers in the order of the queries.
struct FindMatches(GrpcIndexerClient<tonic::transport::Channel>);

impl StreamProtocol for FindMatches {
    type Outgoing = FindMatchesRequest;
    type Incoming = FindMatchesResponse;
    type Answer = FindMatchesResponse;
    type Key = ();

    async fn open(
        &mut self,
        outgoing: ReceiverStream<FindMatchesRequest>,
    ) -> Result<Incoming<FindMatchesResponse>, tonic::Status> {
        Ok(self
            .0
            .find_matches_stream(outgoing)
            .await?
            .into_inner()
            .boxed())
    }

    fn key(&self, _query: &FindMatchesRequest) -> Option<()> {
        None
    }

    fn answer(&self, response: FindMatchesResponse) -> (Answers<()>, Answer) {
        (Answers::Oldest, Ok(response))
    }
}

/// Limits of a query stream: a replica answers within milliseconds, so one that has not
/// answered its oldest query in 5 s is treated as stalled.
const QUERY_STREAM: StreamSettings = StreamSettings {
    name: "query stream",
    queue: 4096,
    max_in_flight: Some(256),
    stalled_after: Some(Duration::from_secs(5)),
};

/// Fan-out client over the indexer replicas of one namespace, kept current from discovery.
#[derive(Clone)]
pub struct IndexerClient {
    inner: Arc<Inner>,
}

struct Inner {
    replicas: InstanceList<Replica>,
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
        let prefix = format!(
            "{}{INDEXER_COMPONENT}/{INDEXER_ENDPOINT}/",
            names::instances_prefix(Some(namespace))
        );
        let replicas =
            InstanceList::watch(discovery.as_ref(), &prefix, "indexer", replica_of, shutdown)
                .await?;
        let inner = Arc::new(Inner {
            replicas,
            num_partitions,
            timeout,
            next: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            missing: AtomicU64::new(0),
        });
        Ok(Self { inner })
    }

    /// Number of replicas currently known.
    pub fn num_replicas(&self) -> usize {
        self.inner.replicas.len()
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
        let replicas = self.inner.replicas.load();
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
            let query = replica.link.query(request.clone());
            match tokio::time::timeout(self.inner.timeout, query).await {
                Ok(Ok(response)) => return Some(response),
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
    let link = match crate::local::lookup(record.instance_id) {
        Some(_) => ReplicaLink::InProcess(record.instance_id),
        None => {
            let endpoint =
                kvmesh_runtime::net::mesh_endpoint(&record.address, Duration::from_secs(1)).ok()?;
            ReplicaLink::Grpc(QueryStream::spawn(
                FindMatches(GrpcIndexerClient::new(endpoint.connect_lazy())),
                QUERY_STREAM,
            ))
        }
    };
    Some(Replica {
        instance_id: record.instance_id,
        layout,
        link,
    })
}
