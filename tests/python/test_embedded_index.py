"""KV routing without indexer processes: a frontend in kv mode keeps its own index from the
JetStream KV event stream (no --use-remote-indexer), and with --serve-indexer serves that index as
`kvmesh.v1.Indexer` to others. Real etcd, NATS and mocker processes."""
import uuid

import grpc

from conftest import (TINY_MODEL, Mesh, Proc, assert_prefix_follows_the_cache, free_port, proto_stubs, require_env,
                      wait_ready, wait_until)

BLOCK = 16


def start(extra_args, rpc_port=None):
    namespace = f"e{uuid.uuid4().hex[:10]}"
    env = {
        "DYN_DISCOVERY_BACKEND": "etcd",
        "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
        "NATS_SERVER": require_env("NATS_SERVER"),
        "DYN_NAMESPACE": namespace,
    }
    mockers = [
        Proc(f"mocker{i}", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                            "--endpoint", f"dyn://{namespace}.backend.generate", "--speedup-ratio", "100",
                            "--block-size", str(BLOCK), "--tcp-rpc-port", str(free_port())], env)
        for i in range(2)
    ]
    port = free_port()
    args = ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port), "--router-mode", "kv",
            *extra_args]
    if rpc_port:
        args += ["--tcp-rpc-port", str(rpc_port)]
    frontend = Proc("frontend", args, env)
    procs = [*mockers, frontend]
    mesh = Mesh(f"http://127.0.0.1:{port}", procs, namespace)
    try:
        wait_ready(mesh.base_url, "tiny", 2, procs)
    except BaseException:
        mesh.print_logs()
        mesh.stop()
        raise
    return mesh


def test_frontend_keeps_its_own_index():
    mesh = start([])
    try:
        assert_prefix_follows_the_cache(mesh, BLOCK, seed=11)
    finally:
        mesh.stop()


def test_served_index_answers_other_callers():
    rpc_port = free_port()
    mesh = start(["--serve-indexer"], rpc_port=rpc_port)
    try:
        pb = proto_stubs()
        indexer = pb["indexer_pb2_grpc"].IndexerStub(grpc.insecure_channel(f"127.0.0.1:{rpc_port}"))
        status = wait_until(lambda: indexer.Status(pb["indexer_pb2"].StatusRequest(), timeout=2),
                            what="served indexer status")
        assert status.state == pb["indexer_pb2"].INDEXER_STATE_SERVING
        worker = assert_prefix_follows_the_cache(mesh, BLOCK, seed=11)
        prefix = [10 + (i * 7) % 200 for i in range(4 * BLOCK)]
        answer = indexer.FindMatches(pb["indexer_pb2"].FindMatchesRequest(
            model="tiny", token_ids=prefix, block_size=BLOCK), timeout=5)
        best = max(answer.scores, key=lambda s: s.device_blocks)
        assert best.worker_id == worker
        assert best.device_blocks == 4
    finally:
        mesh.stop()


def test_serve_indexer_needs_kv_mode_and_not_remote():
    for args in (["--serve-indexer"], ["--router-mode", "kv", "--serve-indexer", "--use-remote-indexer"]):
        proc = Proc("frontend-bad", ["kvmesh-frontend", "--http-port", str(free_port()), *args])
        proc.proc.wait(timeout=15)
        assert proc.proc.returncode == 2, proc.output()
        assert "--serve-indexer" in proc.output()
