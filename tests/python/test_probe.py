"""`kvmesh probe` against real processes (the health check of the compose and Kubernetes
deployments): a mock worker's grpc.health.v1 over the mesh's mutual TLS (probed with the mesh's
flags it passes; plaintext or without a client certificate it fails), a router replica's
`/health` on its metrics port, a frontend's `/health` over HTTPS checked against its CA, and
failures for what is not serving."""
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from conftest import BIN_DIR, TINY_MODEL, Proc, free_port, require_env, wait_until
from pki import Ca


def probe(*args):
    return subprocess.run([str(BIN_DIR / "kvmesh"), "probe", *args], capture_output=True, text=True,
                          timeout=20)


@pytest.fixture(scope="module")
def env():
    return {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
            "NATS_SERVER": require_env("NATS_SERVER"), "DYN_NAMESPACE": f"p{uuid.uuid4().hex[:10]}"}


def test_grpc_probe_of_a_worker_over_mesh_tls(env):
    with tempfile.TemporaryDirectory() as tmp:
        ca = Ca(Path(tmp) / "mesh", "probe mesh CA")
        cert, key = ca.issue("mesh-member", 11)
        tls = ["--tcp-tls-ca-cert-path", str(ca.pem), "--tcp-tls-client-cert-path", str(cert),
               "--tcp-tls-client-key-path", str(key)]
        port = free_port()
        mocker = Proc("probe-mocker", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                                       "--endpoint", f"dyn://{env['DYN_NAMESPACE']}.backend.generate",
                                       "--tcp-rpc-port", str(port), "--tcp-tls-cert-path", str(cert),
                                       "--tcp-tls-key-path", str(key), "--tcp-tls-client-ca-cert-path",
                                       str(ca.pem)], env)
        try:
            address = f"127.0.0.1:{port}"
            wait_until(lambda: probe("grpc", address, *tls).returncode == 0, timeout=60,
                       what="the worker's probe passing over TLS")
            assert probe("grpc", address, *tls).stdout.strip() == "SERVING"
            assert probe("grpc", address, "--timeout", "2").returncode == 1
            assert probe("grpc", address, "--tcp-tls-ca-cert-path", str(ca.pem), "--timeout", "2").returncode == 1
        finally:
            mocker.stop()
        assert probe("grpc", f"127.0.0.1:{port}", *tls, "--timeout", "2").returncode == 1


def test_http_probe_of_a_router_replica(env):
    port, metrics = free_port(), free_port()
    router = Proc("probe-router", ["kvmesh-router", "--router-mode", "kv", "--tcp-rpc-port", str(port),
                                   "--metrics-port", str(metrics)], env)
    url = f"http://127.0.0.1:{metrics}/health"
    try:
        wait_until(lambda: probe("http", url).returncode == 0, timeout=60, what="the router's /health")
        assert '"healthy"' in probe("http", url).stdout
        assert probe("http", f"http://127.0.0.1:{metrics}/live").returncode == 0
        assert probe("grpc", f"127.0.0.1:{port}").returncode == 0
    finally:
        router.stop()
    failed = probe("http", url, "--timeout", "2")
    assert failed.returncode == 1 and "http probe" in failed.stderr


def test_https_probe_of_a_frontend_checks_its_certificate(env):
    with tempfile.TemporaryDirectory() as tmp:
        ca = Ca(Path(tmp) / "edge", "probe edge CA")
        other = Ca(Path(tmp) / "other", "another CA")
        cert, key = ca.issue("edge", 21)
        port = free_port()
        frontend = Proc("probe-frontend", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                                           "--tls-cert-path", str(cert), "--tls-key-path", str(key)], env)
        url = f"https://127.0.0.1:{port}/live"
        try:
            wait_until(lambda: probe("http", url, "--ca-cert-path", str(ca.pem)).returncode == 0, timeout=60,
                       what="the frontend's /live over HTTPS")
            assert probe("http", f"https://localhost:{port}/live", "--ca-cert-path", str(ca.pem)).returncode == 0
            # No worker serves a model yet: /health answers 503 over the verified connection.
            health = probe("http", f"https://127.0.0.1:{port}/health", "--ca-cert-path", str(ca.pem))
            assert health.returncode == 1 and "503" in health.stderr, health.stderr
            untrusted = probe("http", url, "--ca-cert-path", str(other.pem), "--timeout", "2")
            assert untrusted.returncode == 1 and "certificate" in untrusted.stderr.lower(), untrusted.stderr
            no_ca = probe("http", url)
            assert no_ca.returncode == 1 and "--ca-cert-path" in no_ca.stderr
            plain = probe("http", f"http://127.0.0.1:{port}/health", "--timeout", "2")
            assert plain.returncode == 1
        finally:
            frontend.stop()


def test_probe_refuses_what_it_cannot_ask():
    result = probe("http", "ftp://127.0.0.1:1/health")
    assert result.returncode == 1 and "only http:// and https://" in result.stderr
