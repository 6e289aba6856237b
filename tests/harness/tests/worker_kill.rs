//! The worker-kill drill on the in-process mesh: many concurrent streams on real-time workers,
//! read by slow clients, one worker killed once they all run. Its streams move to the others in one burst; every stream,
//! moved or not, completes with its full token count and no error. (Such a burst once closed the
//! surviving workers' whole HTTP/2 connections.) The real-process twin, with SIGKILL, real etcd
//! and NATS, is `tests/python/test_migration.py::test_a_burst_of_migrations_fails_no_stream`.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::time::Duration;

use kvmesh_harness::{Mesh, stream_chat_slowly};

const MAX_TOKENS: u64 = 400;

async fn drill(num_workers: usize, num_streams: usize) {
    let mut mesh = Mesh::builder()
        .workers(num_workers)
        .worker_args(["--speedup-ratio", "1"])
        .frontend_args(["--migration-limit", "3"])
        .start()
        .await
        .unwrap();
    let streams: Vec<_> = (0..num_streams)
        .map(|index| {
            let base_url = mesh.base_url.clone();
            tokio::spawn(async move {
                let body = serde_json::json!({
                    "model": "tiny",
                    "messages": [{"role": "user", "content": format!("story {index}")}],
                    "max_tokens": MAX_TOKENS,
                    "ignore_eos": true,
                });
                // Clients that read more slowly than tokens come, so the frontend holds a backlog
                // on every stream, as it did behind the real drill's Python clients.
                stream_chat_slowly(&base_url, body, Duration::from_millis(20)).await
            })
        })
        .collect();
    // Kill once (nearly) every stream is in flight, so the victim's streams move in one burst;
    // none is near its end then (400 tokens take seconds at real-time speed).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let inflight = mesh
            .metric_sum("dynamo_frontend_inflight_requests{")
            .await
            .unwrap();
        if inflight >= num_streams as f64 * 0.9 || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    mesh.workers[0].kill();

    let mut errors = Vec::new();
    for stream in streams {
        let outcome = stream.await.unwrap().unwrap();
        if outcome.error.is_some() || outcome.completion_tokens != Some(MAX_TOKENS) {
            errors.push(outcome);
        }
    }
    assert!(
        errors.is_empty(),
        "{} of {num_streams} streams failed, e.g. {:?}",
        errors.len(),
        &errors[..errors.len().min(3)]
    );
    let migrated = mesh
        .metric_sum("dynamo_frontend_model_migration_total{")
        .await
        .unwrap();
    assert!(migrated >= 1.0, "no stream moved off the killed worker");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_migrations_onto_one_worker_fails_no_stream() {
    drill(2, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_migrations_onto_three_workers_fails_no_stream() {
    drill(4, 400).await;
}
