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

mod call;
mod clock;
mod extensions;
mod session;
mod spawn;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use kvmesh_proto::v1::chat_processor_client::ChatProcessorClient;
use kvmesh_runtime::discovery::Discovery;
use kvmesh_runtime::discovery::instances::InstanceList;
use kvmesh_runtime::{names, net};
use tokio_util::sync::CancellationToken;

pub use self::extensions::RouteExtensions;
pub(crate) use self::session::{ProcessorRequest, start};
pub use self::spawn::{PARENT_PIPE_ENV, connect_hosts, spawn_host};

/// How long connecting to a host may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone)]
struct Host {
    instance_id: u64,
    client: ChatProcessorClient<tonic::transport::Channel>,
    /// Counts the chat requests sent to this host.
    served: prometheus::IntCounter,
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
    /// Watches the hosts of `processor` registered in `namespace` until `shutdown`; the requests
    /// sent to each count in `served` under its address.
    pub async fn watch(
        discovery: Arc<dyn Discovery>,
        namespace: &str,
        processor: &str,
        served: prometheus::IntCounterVec,
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
                    served: served.with_label_values(&[record.address.as_str()]),
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

    /// The live hosts in the order one request tries them: the next in turn first, then each
    /// other once. One snapshot and one turn per request: with a fresh turn per try, requests
    /// running at the same time could move the turn on between one request's tries and send its
    /// retry back to the host that just failed it.
    fn in_turn(&self) -> impl Iterator<Item = Host> + Send + use<> {
        let hosts = self.hosts.load();
        let turn = if hosts.is_empty() {
            0
        } else {
            self.next.fetch_add(1, Ordering::Relaxed)
        };
        (0..hosts.len()).map(move |i| hosts[(turn + i) % hosts.len()].clone())
    }
}

/// Whether a failed call never reached a host: the connection failed on this side, so the host
/// received nothing and another one may be tried.
fn is_unreachable(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Unavailable
        || (std::error::Error::source(status).is_some()
            && matches!(
                status.code(),
                tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
            ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvmesh_runtime::discovery::mem::{MemDiscovery, MemStore};
    use kvmesh_runtime::discovery::registry::{Registry, instance_record};

    #[tokio::test]
    async fn each_request_tries_every_live_host_once_starting_at_the_next_in_turn() {
        let store = MemStore::new();
        let (mut ids, mut registered) = (Vec::new(), Vec::new());
        for port in [7001, 7002, 7003] {
            let host = Arc::new(MemDiscovery::new(&store));
            let mut record = instance_record(
                DEFAULT_NAMESPACE,
                PROCESSOR_COMPONENT,
                PROCESSOR_ENDPOINT,
                &format!("127.0.0.1:{port}"),
                "grpc",
            );
            record
                .metadata
                .insert(PROCESSOR_METADATA.to_owned(), "proc".to_owned());
            let key = Registry::new(host.clone()).register_instance(&record).await;
            ids.push(key.unwrap().instance_id);
            registered.push(host);
        }
        let served = prometheus::IntCounterVec::new(
            prometheus::Opts::new("served", "chat requests per host"),
            &["address"],
        )
        .unwrap();
        let hosts = ProcessorHosts::watch(
            Arc::new(MemDiscovery::new(&store)),
            DEFAULT_NAMESPACE,
            "proc",
            served,
            CancellationToken::new(),
        )
        .await
        .unwrap();
        for _ in 0..100 {
            if hosts.len() == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(hosts.len(), 3);
        let mut firsts = Vec::new();
        for _ in 0..6 {
            let order: Vec<u64> = hosts.in_turn().map(|host| host.instance_id).collect();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            let mut all = ids.clone();
            all.sort_unstable();
            assert_eq!(sorted, all, "every live host once: {order:?}");
            firsts.push(order[0]);
        }
        // Successive requests start at successive hosts, each host first equally often.
        for id in &ids {
            assert_eq!(firsts.iter().filter(|first| *first == id).count(), 2);
        }
        assert_ne!(firsts[0], firsts[1]);
        assert_ne!(firsts[1], firsts[2]);
    }
}
