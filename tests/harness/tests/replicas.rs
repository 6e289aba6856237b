//! Router replicas and indexer shard replicas in the in-process mesh: requests keep completing
//! while a router replica and an indexer replica are killed and restarted.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::time::Duration;

use kvmesh_harness::{Mesh, stream_chat};

async fn completes(mesh: &Mesh, index: usize) {
    let body = serde_json::json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": format!("the same long system prompt, turn {index}")}],
        "max_tokens": 8,
    });
    let outcome = stream_chat(&mesh.base_url, body).await.unwrap();
    assert_eq!(outcome.error, None, "request {index}");
    assert_eq!(outcome.completion_tokens, Some(8), "request {index}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_survive_a_killed_router_and_indexer_replica() {
    let mut mesh = Mesh::builder()
        .workers(2)
        .worker_args(["--speedup-ratio", "100", "--block-size", "16"])
        .routers(
            2,
            [
                "--router-mode",
                "kv",
                "--use-remote-indexer",
                "--router-replica-sync",
            ],
        )
        .indexers(1, 2)
        .start()
        .await
        .unwrap();
    // The replicas register once they serve; give them a moment to appear to the frontend.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for index in 0..5 {
        completes(&mesh, index).await;
    }
    mesh.routers[0].kill();
    mesh.indexers[0].kill();
    for index in 5..15 {
        completes(&mesh, index).await;
    }
    mesh.routers[0].restart();
    mesh.indexers[0].restart();
    assert!(mesh.routers[0].is_running() && mesh.indexers[0].is_running());
    for index in 15..20 {
        completes(&mesh, index).await;
    }
    for service in mesh.routers.iter_mut().chain(mesh.indexers.iter_mut()) {
        service.stop().await.unwrap();
    }
}
