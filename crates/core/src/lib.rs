//! The protocol-free vocabulary every kvmesh crate shares, with no gRPC, HTTP or NATS in it, so
//! that pure libraries (the routing core) and the services agree on it: the error-code table,
//! the flag value parsers and the prefix store that lets one prompt's work serve the next.

pub mod error;
pub mod flags;
pub mod identity_hash;
pub mod prefix;

pub use error::ErrorCode;
pub use identity_hash::{BuildIdentityHasher, IdentityHasher};
