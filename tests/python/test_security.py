"""Edge security (docs/security.md) on real processes: HTTPS and KServe gRPC over TLS checked by
clients that verify the certificate against a test CA, certificate and key files replaced while
serving, mutual TLS with --tls-client-ca-cert-path, API keys on every inference route and on
KServe inference, and the admin key and JSON content type of /busy_threshold."""
import shutil
import socket
import ssl
import tempfile
import time
import uuid
from pathlib import Path

import anthropic
import grpc
import httpx2
import numpy as np
import openai
import pytest
import requests
import tritonclient.grpc as triton
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from conftest import TINY_MODEL, Mesh, Proc, free_port, require_env, wait_until
from pki import Ca

API_KEY = "sk-test-" + uuid.uuid4().hex
ADMIN_KEY = "admin-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def pki():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ca = Ca(tmp / "ca")
        ca.first = ca.issue("kvmesh-edge-1", 1001)
        ca.second = ca.issue("kvmesh-edge-2", 2002)
        ca.live = tmp / "live"
        ca.live.mkdir()
        yield ca


def serve_files(pki, pair):
    """Copies `pair` to the files the frontend serves from: (cert, key) paths."""
    cert, key = pki.live / "edge.pem", pki.live / "edge.key"
    # Written beside and renamed over, as a certificate manager does.
    for source, target in zip(pair, (cert, key)):
        shutil.copy(source, target.with_suffix(".tmp"))
        target.with_suffix(".tmp").replace(target)
    return cert, key


def wait_https(base, ca, procs, cert=None, path="/health", model="tiny"):
    def ready():
        for p in procs:
            assert p.alive(), f"{p.name} exited early:\n{p.output()[-3000:]}"
        r = requests.get(f"{base}{path}", verify=str(ca), cert=cert, timeout=2)
        return r.status_code == 200 and model in r.json().get("models", [])
    wait_until(ready, timeout=60, what=f"{base} ready over HTTPS")


@pytest.fixture(scope="module")
def keys_dir():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "api").write_text(f"# clients\n\n{API_KEY}\n")
        (tmp / "admin").write_text(f"{ADMIN_KEY}\n")
        yield tmp


@pytest.fixture(scope="module")
def edge(pki, keys_dir):
    """`kvmesh up` with HTTPS, KServe gRPC over TLS, API keys, admin keys and Anthropic routes."""
    cert, key = serve_files(pki, pki.first)
    port, grpc_port = free_port(), free_port()
    proc = Proc("up-secure", ["kvmesh", "up", "--http-host", "127.0.0.1", "--http-port", str(port),
                              "--kserve-grpc-port", str(grpc_port), "--num-workers", "1",
                              "--tcp-rpc-port", str(free_port()), "--speedup-ratio", "100",
                              "--enable-anthropic-api", "--tls-cert-path", str(cert),
                              "--tls-key-path", str(key), "--http-api-keys-file", str(keys_dir / "api"),
                              "--http-admin-keys-file", str(keys_dir / "admin")])
    mesh = Mesh(f"https://127.0.0.1:{port}", [proc])
    mesh.port = port
    mesh.grpc = f"127.0.0.1:{grpc_port}"
    try:
        wait_https(mesh.base_url, pki.pem, [proc])
    except BaseException:
        mesh.print_logs()
        mesh.stop()
        raise
    yield mesh
    mesh.stop()


def peer_certificate(port, ca, alpn=("h2", "http/1.1")):
    """A fresh verified connection's (selected ALPN, peer certificate)."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(list(alpn))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.selected_alpn_protocol(), tls.getpeercert()


def common_name(certificate):
    return dict(pair[0] for pair in certificate["subject"])["commonName"]


def test_https_with_a_verifying_openai_client(edge, pki):
    http_client = httpx2.Client(verify=ssl.create_default_context(cafile=str(pki.pem)))
    client = openai.OpenAI(base_url=f"{edge.base_url}/v1", api_key=API_KEY, max_retries=0,
                           http_client=http_client)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4)
    assert chat.choices[0].message.content is not None
    stream = client.completions.create(model="tiny", prompt="hello", max_tokens=4, stream=True)
    assert len([chunk for chunk in stream]) >= 1
    # Both HTTP versions are offered; h2 wins when the client offers it.
    assert peer_certificate(edge.port, pki.pem)[0] == "h2"
    assert peer_certificate(edge.port, pki.pem, alpn=["http/1.1"])[0] == "http/1.1"


def test_a_client_that_does_not_trust_the_ca_is_refused(edge):
    client = openai.OpenAI(base_url=f"{edge.base_url}/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{edge.base_url}/live", timeout=5)
    # Plaintext on the TLS port gets no HTTP answer.
    with pytest.raises(requests.RequestException):
        requests.get(f"http://127.0.0.1:{edge.port}/live", timeout=5)


def test_stalled_tls_handshakes_are_dropped_at_their_deadline_while_others_are_served(edge, pki):
    """Connections that open TCP and never send a ClientHello hold no one up: verified clients are
    served meanwhile, and each stalled one is closed by the server at the 10 s handshake deadline
    (crates/runtime/src/tls/accept.rs), not at once and not never."""
    stalled = [socket.create_connection(("127.0.0.1", edge.port), timeout=5) for _ in range(32)]
    began = time.monotonic()
    try:
        assert peer_certificate(edge.port, pki.pem)[0] == "h2"
        assert requests.get(f"{edge.base_url}/live", verify=str(pki.pem), timeout=5).ok
        for conn in stalled:
            conn.settimeout(max(0.1, 20 - (time.monotonic() - began)))
            try:
                assert conn.recv(1) == b""
            except ConnectionResetError:
                pass
        elapsed = time.monotonic() - began
        assert 9.0 <= elapsed <= 16.0, elapsed
        assert requests.get(f"{edge.base_url}/live", verify=str(pki.pem), timeout=5).ok
    finally:
        for conn in stalled:
            conn.close()


def test_kserve_over_tls_needs_the_key_for_inference(edge, pki):
    client = triton.InferenceServerClient(edge.grpc, ssl=True, root_certificates=str(pki.pem))
    assert client.is_server_live()
    assert client.is_model_ready("tiny")
    text = triton.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"hello there"], dtype=np.object_))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("tiny", [text])
    assert "UNAUTHENTICATED" in str(refused.value.status()), refused.value
    with pytest.raises(InferenceServerException):
        client.infer("tiny", [text], headers={"authorization": "Bearer wrong"})
    result = client.infer("tiny", [text], headers={"authorization": f"Bearer {API_KEY}"})
    assert result.as_numpy("text_output") is not None

    # A raw grpcio stub: the stream needs the key too, and a plaintext channel gets nowhere.
    credentials = grpc.ssl_channel_credentials(root_certificates=pki.pem.read_bytes())
    with grpc.secure_channel(edge.grpc, credentials) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="tiny", inputs=[pb.ModelInferRequest.InferInputTensor(
            name="text_input", datatype="BYTES", shape=[1], contents=pb.InferTensorContents(bytes_contents=[b"hi"]))])
        with pytest.raises(grpc.RpcError) as error:
            list(stub.ModelStreamInfer(iter([request]), timeout=10))
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answers = list(stub.ModelStreamInfer(iter([request]), timeout=30,
                                             metadata=[("authorization", f"Bearer {API_KEY}")]))
        assert answers and not answers[0].error_message
    with grpc.insecure_channel(edge.grpc) as channel:
        with pytest.raises(grpc.RpcError):
            pb_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=5)


ROUTES = [
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2}),
    ("/v1/embeddings", {"model": "tiny", "input": "hi"}),
    ("/v1/responses", {"model": "tiny", "input": "hi", "max_output_tokens": 2}),
]
ANTHROPIC_ROUTES = [
    ("/v1/messages", {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages/count_tokens", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
]


def test_every_inference_route_needs_an_api_key(edge, pki):
    def post(path, body, headers):
        return requests.post(f"{edge.base_url}{path}", json=body, headers=headers, verify=str(pki.pem), timeout=30)

    for path, body in ROUTES:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {API_KEY}"},
                        {"x-api-key": API_KEY}):
            r = post(path, body, headers)
            assert r.status_code == 401, (path, headers, r.text)
            assert r.json()["error"]["type"] == "authentication_error", r.text
            assert r.headers["www-authenticate"] == "Bearer"
            assert API_KEY not in r.text
        r = post(path, body, {"Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 200, (path, r.text)
    for path, body in ANTHROPIC_ROUTES:
        for headers in ({}, {"x-api-key": "wrong"}):
            r = post(path, body, headers)
            assert r.status_code == 401, (path, r.text)
            assert r.json()["type"] == "error", r.text
            assert r.json()["error"]["type"] == "authentication_error", r.text
        for headers in ({"x-api-key": API_KEY}, {"Authorization": f"Bearer {API_KEY}"}):
            assert post(path, body, headers).status_code == 200, (path, headers)
    # The SDKs read the 401 as an authentication error.
    http_client = httpx2.Client(verify=ssl.create_default_context(cafile=str(pki.pem)))
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{edge.base_url}/v1", api_key="wrong", max_retries=0,
                      http_client=http_client).completions.create(model="tiny", prompt="hi", max_tokens=1)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=edge.base_url, api_key="wrong", max_retries=0,
                            http_client=http_client).messages.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    message = anthropic.Anthropic(base_url=edge.base_url, api_key=API_KEY, max_retries=0,
                                  http_client=http_client).messages.create(
        model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert message.type == "message"
    # Health, liveness, metrics, the model list and the API description stay open; an unknown
    # path is still a 404.
    for path in ("/health", "/live", "/metrics", "/v1/models", "/openapi.json", "/docs/"):
        assert requests.get(f"{edge.base_url}{path}", verify=str(pki.pem), timeout=5).status_code == 200, path
    assert requests.post(f"{edge.base_url}/v1/nope", json={}, verify=str(pki.pem), timeout=5).status_code == 404


def test_busy_threshold_needs_the_admin_key_and_json(edge, pki):
    url = f"{edge.base_url}/busy_threshold"
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for headers in ({}, {"Authorization": f"Bearer {API_KEY}"}):
        r = requests.get(url, headers=headers, verify=str(pki.pem), timeout=5)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text
        r = requests.post(url, json={"model": "tiny", "active_decode_blocks_threshold": 0},
                          headers=headers, verify=str(pki.pem), timeout=5)
        assert r.status_code == 401, r.text
    assert requests.get(url, headers=admin, verify=str(pki.pem), timeout=5).status_code == 200
    # What a cross-site HTML form can send is refused before it is read.
    for content_type, data in (("application/x-www-form-urlencoded", "model=tiny"),
                               ("text/plain", '{"model": "tiny", "active_decode_blocks_threshold": 0}'),
                               (None, '{"model": "tiny"}')):
        headers = dict(admin, **({"Content-Type": content_type} if content_type else {}))
        r = requests.post(url, data=data, headers=headers, verify=str(pki.pem), timeout=5)
        assert r.status_code == 415, (content_type, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    r = requests.post(url, json={"model": "tiny", "active_decode_blocks_threshold": 0.9}, headers=admin,
                      verify=str(pki.pem), timeout=5)
    assert r.status_code == 200, r.text
    assert r.json()["active_decode_blocks_threshold"] == 0.9


def test_key_files_are_reread_when_they_change(edge, pki, keys_dir):
    def status(key):
        return requests.post(f"{edge.base_url}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 1},
                             headers={"Authorization": f"Bearer {key}"}, verify=str(pki.pem), timeout=30).status_code

    new_key = "sk-rotated-" + uuid.uuid4().hex
    assert status(new_key) == 401
    (keys_dir / "api").write_text(f"{API_KEY}\n{new_key}\n")
    wait_until(lambda: status(new_key) == 200, timeout=15, what="the added key")
    # A file left without a key keeps the loaded keys (and says so in the log).
    (keys_dir / "api").write_text("# nothing yet\n")
    time.sleep(5)
    assert status(new_key) == 200
    assert "reload failed" in edge.procs[0].output()
    assert new_key not in edge.procs[0].output() and API_KEY not in edge.procs[0].output()
    (keys_dir / "api").write_text(f"{API_KEY}\n")
    wait_until(lambda: status(new_key) == 401, timeout=15, what="the removed key refused")
    assert status(API_KEY) == 200


def test_certificates_reload_without_a_restart(edge, pki):
    assert common_name(peer_certificate(edge.port, pki.pem)[1]) == "kvmesh-edge-1"
    pid = edge.procs[0].proc.pid
    serve_files(pki, pki.second)
    wait_until(lambda: common_name(peer_certificate(edge.port, pki.pem)[1]) == "kvmesh-edge-2",
               timeout=15, what="the new certificate served")
    _, certificate = peer_certificate(edge.port, pki.pem)
    assert int(certificate["serialNumber"], 16) == 2002
    # KServe gRPC serves the new certificate too.
    client = triton.InferenceServerClient(edge.grpc, ssl=True, root_certificates=str(pki.pem))
    assert client.is_server_live()
    # A broken pair (the first certificate with the second key) keeps the served one.
    shutil.copy(pki.first[0], pki.live / "edge.pem")
    time.sleep(5)
    assert common_name(peer_certificate(edge.port, pki.pem)[1]) == "kvmesh-edge-2"
    assert "edge tls certificate" in edge.procs[0].output() and "reload failed" in edge.procs[0].output()
    serve_files(pki, pki.first)
    wait_until(lambda: common_name(peer_certificate(edge.port, pki.pem)[1]) == "kvmesh-edge-1",
               timeout=15, what="the first certificate back")
    assert edge.procs[0].alive() and edge.procs[0].proc.pid == pid


def test_client_certificates_with_a_client_ca(pki):
    """--tls-client-ca-cert-path: the real frontend in KServe mode with a mock worker over etcd;
    the KServe port and the side HTTP server both need a client certificate from the CA."""
    namespace = f"t{uuid.uuid4().hex[:10]}"
    env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
           "NATS_SERVER": require_env("NATS_SERVER")}
    grpc_port, side_port = free_port(), free_port()
    cert, key = pki.first
    other = Ca(pki.dir / "other", name="another CA")
    stranger = other.issue("stranger", 7)
    frontend = Proc("frontend-mtls", [
        "kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(grpc_port), "--namespace", namespace,
        "--kserve-grpc-server", "--grpc-metrics-port", str(side_port), "--tls-cert-path", str(cert),
        "--tls-key-path", str(key), "--tls-client-ca-cert-path", str(pki.pem)], env)
    mocker = Proc("mocker-mtls", [
        "kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
        "--endpoint", f"dyn://{namespace}.backend.generate", "--speedup-ratio", "100",
        "--tcp-rpc-port", str(free_port())], env)
    mesh = Mesh(f"https://127.0.0.1:{side_port}", [frontend, mocker])
    try:
        wait_https(mesh.base_url, pki.pem, mesh.procs, cert=(str(cert), str(key)))
        with pytest.raises(requests.RequestException):
            requests.get(f"{mesh.base_url}/live", verify=str(pki.pem), timeout=5)
        with pytest.raises(requests.RequestException):
            requests.get(f"{mesh.base_url}/live", verify=str(pki.pem), cert=tuple(map(str, stranger)), timeout=5)
        client = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}", ssl=True, root_certificates=str(pki.pem),
                                              private_key=str(key), certificate_chain=str(cert))
        text = triton.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([b"hello there"], dtype=np.object_))
        assert client.infer("tiny", [text]).as_numpy("text_output") is not None
        anonymous = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}", ssl=True,
                                                 root_certificates=str(pki.pem))
        with pytest.raises(InferenceServerException):
            anonymous.is_server_live(client_timeout=5)
    finally:
        mesh.stop()
