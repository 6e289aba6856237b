//! Entry points of the fuzz targets in `fuzz/` and of the corpus replay that CI runs as an ordinary
//! test (docs/security.md, "Fuzzing"): one function per decoder of a client's input, calling the
//! real parsing and checks and panicking only when a property of them breaks.

use kvmesh_proto::inference::ModelInferRequest;
use prost::Message;

pub use crate::http::fuzzing::{anthropic_messages, chat_completions, completions, responses};
use crate::kserve::tensors;

/// A KServe `ModelInferRequest` as it arrives on `ModelInfer`/`ModelStreamInfer`: the protobuf
/// decoding, the tensors and parameters mapped to a completions request, its checks and the
/// routing parameters. A request that fails must fail as a client error.
pub fn kserve_infer(message: &[u8]) {
    let Ok(request) = ModelInferRequest::decode(message) else {
        return;
    };
    let checked = tensors::decode_inputs(&request).and_then(|inputs| {
        let completion = tensors::completion_request(&request, inputs.text, inputs.streaming)?;
        crate::completion::check(&completion)?;
        tensors::routing_hints(&request, false)
    });
    if let Err(error) = checked {
        crate::http::fuzzing::assert_client_error(&error);
        assert_ne!(error.to_status().code(), tonic::Code::Internal, "{error}");
    }
}
