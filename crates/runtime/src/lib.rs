//! What every kvmesh process shares: discovery, the event plane, configuration, telemetry,
//! errors and graceful shutdown.

pub mod allocator;
pub mod config;
pub mod connect;
pub mod discovery;
pub mod error;
pub mod event_plane;
pub mod fuzzing;
pub mod health;
pub mod kv_publish;
pub mod lifecycle;
pub mod names;
pub mod net;
pub mod otel;
pub mod prefix_cuts;
pub mod reload;
pub mod shutdown;
pub mod stream_client;
pub mod telemetry;
pub mod tls;
pub mod worker_client;

pub use error::{Error, ErrorCode, GrpcErrorCode, Result};
