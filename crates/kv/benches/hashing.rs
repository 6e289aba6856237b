//! Throughput of block hashing, in bytes of token ids hashed per second.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kvmesh_kv::{BlockHasher, compute_seq_hashes};

fn bench_hashing(c: &mut Criterion) {
    let tokens: Vec<u32> = (0..131_072u32)
        .map(|i| i.wrapping_mul(2_654_435_761) % 150_000)
        .collect();
    let mut group = c.benchmark_group("block_hashing");
    group.throughput(Throughput::Bytes((tokens.len() * 4) as u64));
    for block_size in [16usize, 64, 512] {
        group.bench_function(format!("local_b{block_size}"), |b| {
            let mut hasher = BlockHasher::new(block_size, 1337);
            let mut out = Vec::with_capacity(tokens.len() / block_size);
            b.iter(|| {
                out.clear();
                hasher.hash_blocks_into(std::hint::black_box(&tokens), &mut out);
                out.len()
            });
        });
    }
    group.bench_function("local_plus_sequence_b64", |b| {
        let mut hasher = BlockHasher::new(64, 1337);
        let mut out = Vec::new();
        b.iter(|| {
            out.clear();
            hasher.hash_blocks_into(std::hint::black_box(&tokens), &mut out);
            compute_seq_hashes(&out).len()
        });
    });
    group.finish();
}

criterion_group!(benches, bench_hashing);
criterion_main!(benches);
