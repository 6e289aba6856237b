//! The KServe v2 gRPC edge (docs/kserve.md). So far: the LLM mapping between KServe tensors and
//! the completions path ([`tensors`]); the `GRPCInferenceService` server that uses it is the
//! next step of this edge.

pub mod tensors;
