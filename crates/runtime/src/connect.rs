//! Turns the shared runtime options into live backends, so every binary (and `kvmesh up`, which
//! shares one in-memory store and event plane between its embedded services) connects the same way.

use std::sync::Arc;
use std::time::Duration;

use crate::Result;
use crate::config::credentials::Credentials;
use crate::config::{DiscoveryBackend, RuntimeOpts};
use crate::discovery::Discovery;
use crate::discovery::etcd::{EtcdDiscovery, EtcdSecurity};
use crate::discovery::file::FileDiscovery;
use crate::discovery::mem::{MemDiscovery, MemStore};
use crate::event_plane::EventPlane;
use crate::event_plane::mem::MemEventPlane;
use crate::event_plane::nats::{NatsEventPlane, NatsSecurity};

/// Lease TTL of registrations (etcd lease, file heartbeat expiry).
pub const LEASE_TTL: Duration = Duration::from_secs(10);

/// In-process backends shared by the services that `kvmesh up` runs in one process.
#[derive(Clone, Default)]
pub struct Embedded {
    /// The shared discovery store; each service gets its own handle (its own instance id).
    pub store: MemStore,
    /// The shared in-process event plane.
    pub events: Arc<MemEventPlane>,
    /// Embedded workers serve gRPC on loopback instead of being called in-process, so a
    /// one-process test mesh exercises the same worker connections as separate processes do.
    pub grpc_workers: bool,
}

impl Embedded {
    /// Creates an empty store and event plane.
    pub fn new() -> Self {
        Self::default()
    }
}

/// Connects a discovery handle for one registering process (or one embedded service).
pub async fn discovery(
    opts: &RuntimeOpts,
    embedded: Option<&Embedded>,
) -> Result<Arc<dyn Discovery>> {
    Ok(match opts.discovery_backend {
        DiscoveryBackend::Mem => match embedded {
            Some(embedded) => Arc::new(MemDiscovery::new(&embedded.store)),
            None => Arc::new(MemDiscovery::new(&MemStore::new())),
        },
        DiscoveryBackend::File => {
            Arc::new(FileDiscovery::with_ttl(opts.file_kv_root(), LEASE_TTL)?)
        }
        DiscoveryBackend::Etcd => Arc::new(
            EtcdDiscovery::connect_secured(&opts.etcd_endpoints, LEASE_TTL, &etcd_security(opts)?)
                .await?,
        ),
        DiscoveryBackend::Kubernetes => {
            return Err(crate::Error::Config(
                "--discovery-backend (DYN_DISCOVERY_BACKEND): kubernetes is not supported yet"
                    .into(),
            ));
        }
    })
}

/// Connects the event plane: the embedded mesh's own when there is one (`kvmesh up`, whatever
/// its discovery), in-process with mem discovery, NATS otherwise.
pub async fn event_plane(
    opts: &RuntimeOpts,
    embedded: Option<&Embedded>,
) -> Result<Arc<dyn EventPlane>> {
    if let Some(embedded) = embedded {
        return Ok(embedded.events.clone());
    }
    if opts.discovery_backend == DiscoveryBackend::Mem {
        return Ok(Arc::new(MemEventPlane::new()));
    }
    Ok(Arc::new(
        NatsEventPlane::connect_secured(&opts.nats_server, &nats_security(opts)?).await?,
    ))
}

/// The etcd client's TLS (`--etcd-tls-*`, `ETCD_AUTH_*`) and user.
pub fn etcd_security(opts: &RuntimeOpts) -> Result<EtcdSecurity> {
    let tls = &opts.tls;
    Ok(EtcdSecurity {
        ca: tls.etcd_tls_ca_cert_path.clone(),
        client: tls
            .etcd_tls_client_cert_path
            .clone()
            .zip(tls.etcd_tls_client_key_path.clone()),
        user: Credentials::from_env()
            .map_err(crate::Error::Config)?
            .etcd_user,
    })
}

/// The NATS client's TLS (`--nats-tls-*`) and credentials (`NATS_AUTH_*`).
pub fn nats_security(opts: &RuntimeOpts) -> Result<NatsSecurity> {
    let tls = &opts.tls;
    Ok(NatsSecurity {
        ca: tls.nats_tls_ca_cert_path.clone(),
        client: tls
            .nats_tls_client_cert_path
            .clone()
            .zip(tls.nats_tls_client_key_path.clone()),
        insecure: tls.nats_insecure(),
        auth: Credentials::from_env().map_err(crate::Error::Config)?.nats,
        credentials_file: tls.nats_auth_credentials_file.clone(),
    })
}
