"""The hardened compose mesh (`KVMESH_TLS=1 deploy/compose/up.sh`, docker-compose.tls.yml): every
service comes up healthy with its health check speaking TLS where the service does; the openai
SDK streams a chat through the HTTPS edge and the processor host with the API key and is refused
without it; KServe gRPC answers over TLS; KV events cross NATS over TLS (prefix-sharing requests
follow the cache); a worker's internal gRPC refuses plaintext and callers without a mesh
certificate, and etcd refuses a client without one.

Needs docker and docker-compose; skipped where docker is not reachable."""
import ssl
import subprocess

import httpx2
import numpy as np
import openai
import pytest
import requests
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException

from compose_mesh import ComposeMesh, docker_ok
from conftest import assert_prefix_follows_the_cache

BLOCK = 16
MESH = "/etc/kvmesh/mesh"

pytestmark = pytest.mark.skipif(not docker_ok(), reason="docker or docker-compose not available")


@pytest.fixture(scope="module")
def mesh():
    with ComposeMesh(tls=True).up() as mesh:
        yield mesh


def test_every_service_is_healthy(mesh):
    mesh.assert_healthy({"etcd": 1, "nats": 1, "indexer-0": 1, "indexer-1": 1, "mocker": 2, "router": 2,
                         "processor": 1, "frontend": 1, "otel-collector": 1})


def test_openai_sdk_over_https_needs_the_api_key(mesh):
    http_client = httpx2.Client(verify=ssl.create_default_context(cafile=str(mesh.edge_ca)))
    client = openai.OpenAI(base_url=f"{mesh.base_url}/v1", api_key=mesh.api_key, http_client=http_client,
                           max_retries=0)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello over TLS"}], max_tokens=8, stream=True))
    assert chunks and chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks)
    keyless = openai.OpenAI(base_url=f"{mesh.base_url}/v1", api_key="not-a-key", http_client=http_client,
                            max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        keyless.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{mesh.base_url}/live", timeout=5)


def test_kserve_over_tls(mesh):
    client = triton.InferenceServerClient(f"127.0.0.1:{mesh.kserve_port}", ssl=True,
                                          root_certificates=str(mesh.edge_ca))
    assert client.is_model_ready("tiny")
    text = triton.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hello through compose"], dtype=np.object_))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("tiny", [text])
    assert "UNAUTHENTICATED" in str(refused.value.status()), refused.value
    result = client.infer("tiny", [text], headers={"authorization": f"Bearer {mesh.api_key}"})
    assert result.as_numpy("text_output") is not None


def test_kv_routing_over_nats_with_tls(mesh):
    assert_prefix_follows_the_cache(mesh, BLOCK, settle=2.0)


def probe_from_nats(mesh, *args):
    """`kvmesh probe` run in the NATS container: it holds the mesh certificate but none of the
    DYN_TCP_TLS_* variables, so the probe uses exactly the flags given."""
    nats = mesh.containers("nats")[0]
    return subprocess.run(["docker", "exec", nats, "kvmesh", "probe", *args, "--timeout", "3"],
                          capture_output=True, text=True)


def test_internal_grpc_and_etcd_only_let_mesh_members_in(mesh):
    worker = f"{mesh.address(mesh.containers('mocker')[0])}:7000"
    member = ["--tcp-tls-ca-cert-path", f"{MESH}/ca.pem", "--tcp-tls-client-cert-path", f"{MESH}/tls.crt",
              "--tcp-tls-client-key-path", f"{MESH}/tls.key"]
    serving = probe_from_nats(mesh, "grpc", worker, *member)
    assert serving.returncode == 0 and "SERVING" in serving.stdout, serving.stderr
    # Each refusal is at the connection (a bad frame, a closed pipe, the handshake's alert or
    # close: the wording depends on timing), never an RPC or HTTP answer.
    plaintext = probe_from_nats(mesh, "grpc", worker)
    assert plaintext.returncode == 1 and "transport error" in plaintext.stderr, plaintext.stderr
    no_certificate = probe_from_nats(mesh, "grpc", worker, *member[:2])
    assert no_certificate.returncode == 1 and "transport error" in no_certificate.stderr, no_certificate.stderr
    # etcd's client port is TLS with client certificates: plaintext gets no answer, and a
    # verified TLS connection without a certificate is refused.
    plaintext = probe_from_nats(mesh, "http", "http://etcd:2379/health")
    assert plaintext.returncode == 1 and "connection closed" in plaintext.stderr, plaintext.stderr
    refused = probe_from_nats(mesh, "http", "https://etcd:2379/health", "--ca-cert-path", f"{MESH}/ca.pem")
    assert refused.returncode == 1 and "connection" in refused.stderr, refused.stderr
