//! The protocol-free vocabulary every kvmesh crate shares, with no gRPC, HTTP or NATS in it, so
//! that pure libraries (the routing core) and the services agree on it: the error-code table and
//! the flag value parsers.

pub mod error;
pub mod flags;

pub use error::ErrorCode;
