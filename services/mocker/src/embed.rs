//! The mock engine's embeddings: a deterministic unit vector per input, so that tests can tell
//! that the same input gives the same vector and different inputs give different ones. The
//! vector is a pseudo-random sequence seeded by a hash of the input's token ids, normalized to
//! unit length; it carries no meaning beyond that.

use kvmesh_proto::v1::{EmbedRequest, EmbedResponse, Embedding};
use kvmesh_runtime::GrpcErrorCode as _;

/// Vector length when the request asks for none.
pub const DEFAULT_DIMENSIONS: u32 = 384;

/// Longest vector the mock engine makes.
pub const MAX_DIMENSIONS: u32 = 4096;

/// Embeds every input of `request`.
pub fn embed(request: &EmbedRequest) -> Result<EmbedResponse, tonic::Status> {
    let dimensions = match request.dimensions {
        0 => DEFAULT_DIMENSIONS,
        n if n <= MAX_DIMENSIONS => n,
        n => {
            return Err(
                kvmesh_runtime::ErrorCode::InvalidArgument.to_status(format!(
                    "dimensions {n} is more than this model's {MAX_DIMENSIONS}"
                )),
            );
        }
    };
    if request.inputs.is_empty() || request.inputs.iter().any(|i| i.token_ids.is_empty()) {
        return Err(kvmesh_runtime::ErrorCode::InvalidArgument
            .to_status("every input must have at least one token"));
    }
    let embeddings = request
        .inputs
        .iter()
        .map(|input| Embedding {
            values: unit_vector(&input.token_ids, dimensions as usize),
        })
        .collect();
    Ok(EmbedResponse { embeddings })
}

/// The vector of `tokens`: splitmix64 seeded by the tokens' xxh3 hash, scaled to unit length.
fn unit_vector(tokens: &[u32], dimensions: usize) -> Vec<f32> {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let mut state = xxhash_rust::xxh3::xxh3_64(&bytes);
    let mut values: Vec<f32> = (0..dimensions)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            // The top 24 bits as a float in [-1, 1).
            ((z >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect();
    let norm = values.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        values.iter_mut().for_each(|v| *v /= norm);
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvmesh_proto::v1::EmbedInput;

    fn request(inputs: &[&[u32]], dimensions: u32) -> EmbedRequest {
        EmbedRequest {
            inputs: inputs
                .iter()
                .map(|t| EmbedInput {
                    token_ids: t.to_vec(),
                })
                .collect(),
            dimensions,
            ..Default::default()
        }
    }

    #[test]
    fn same_input_same_unit_vector_and_others_differ() {
        let response = embed(&request(&[&[1, 2, 3], &[1, 2, 3], &[1, 2, 4]], 0)).unwrap();
        let [a, b, c] = &response.embeddings[..] else {
            panic!("three vectors")
        };
        assert_eq!(a.values.len(), DEFAULT_DIMENSIONS as usize);
        assert_eq!(a.values, b.values);
        assert_ne!(a.values, c.values);
        let norm: f32 = c.values.iter().map(|v| v * v).sum();
        assert!((norm - 1.0).abs() < 1e-4, "{norm}");
        let short = embed(&request(&[&[1, 2, 3]], 8)).unwrap();
        assert_eq!(short.embeddings[0].values.len(), 8);
        assert!(embed(&request(&[&[1]], MAX_DIMENSIONS + 1)).is_err());
        assert!(embed(&request(&[&[]], 0)).is_err());
    }
}
