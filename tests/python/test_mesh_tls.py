"""Security inside the mesh (docs/security.md) on real processes: mutual TLS on every internal gRPC
service with the --tcp-tls-* flags (a full mesh serving the openai SDK, a certificate of another CA
refused, certificate files replaced while serving, `kvmesh up`), NATS with TLS, a client
certificate and user/password, a token, an NKey or a credentials file (NKeys and JWTs from
nats_auth.py), and etcd with TLS, client-certificate authentication and user/password
authentication enabled. Certificates come from the `openssl` command line."""
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import grpc
import pytest
import requests

from conftest import (Mesh, Proc, TINY_MODEL, assert_prefix_follows_the_cache, free_port, proto_stubs,
                      require_env, start_distributed, wait_ready, wait_until)
from nats_auth import NKey, Operator, creds
from pki import Ca

BLOCK = 16


@pytest.fixture(scope="module")
def pki():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ca = Ca(tmp / "mesh", "kvmesh mesh CA")
        ca.member = ca.issue("mesh-member-1", 101)
        ca.renewed = ca.issue("mesh-member-2", 202)
        other = Ca(tmp / "other", "another CA")
        ca.outsider = other.issue("outsider", 303)
        ca.other = other
        ca.tmp = tmp
        yield ca


def mesh_flags(pki, pair=None):
    """Every --tcp-tls-* flag: serve with `pair`, demand client certificates of the mesh CA, dial
    over TLS verifying peers with it, present `pair` as the client certificate."""
    cert, key = pair or pki.member
    return ["--tcp-tls-cert-path", str(cert), "--tcp-tls-key-path", str(key),
            "--tcp-tls-client-ca-cert-path", str(pki.pem), "--tcp-tls-ca-cert-path", str(pki.pem),
            "--tcp-tls-client-cert-path", str(cert), "--tcp-tls-client-key-path", str(key)]


def secure_channel(address, ca, pair=None):
    cert, key = pair or (None, None)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes(),
        private_key=Path(key).read_bytes() if key else None,
        certificate_chain=Path(cert).read_bytes() if cert else None)
    return grpc.secure_channel(address, credentials)


def assert_only_the_mesh_gets_in(address, call, pki):
    """`call(channel)` works with a mesh certificate; with another CA's, none, or plaintext the
    connection is refused (UNAVAILABLE: the handshake fails before any RPC)."""
    call(secure_channel(address, pki.pem, pki.member))
    for name, channel in [("another CA", secure_channel(address, pki.pem, pki.outsider)),
                          ("no certificate", secure_channel(address, pki.pem)),
                          ("plaintext", grpc.insecure_channel(address))]:
        with pytest.raises(grpc.RpcError) as refused:
            call(channel)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, (name, refused.value)


def chat(mesh):
    reply = mesh.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hello mesh"}], max_tokens=8)
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0
    return reply


def test_a_full_mesh_over_mutual_tls_serves_the_openai_sdk(pki):
    """Frontend → router replica → mocker workers, router → remote indexer, all over mTLS; the
    workers, the router and the indexer refuse a certificate of another CA."""
    namespace = f"m{uuid.uuid4().hex[:10]}"
    env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
           "NATS_SERVER": require_env("NATS_SERVER"), "DYN_NAMESPACE": namespace}
    flags = mesh_flags(pki)
    indexer_port, router_port, port = free_port(), free_port(), free_port()
    worker_ports = [free_port(), free_port()]
    procs = [Proc("indexer", ["kvmesh-indexer", "--tcp-rpc-port", str(indexer_port), *flags], env)]
    procs += [Proc(f"mocker{i}", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                                  "--endpoint", f"dyn://{namespace}.backend.generate", "--speedup-ratio", "100",
                                  "--block-size", str(BLOCK), "--tcp-rpc-port", str(p), *flags], env)
              for i, p in enumerate(worker_ports)]
    procs.append(Proc("router", ["kvmesh-router", "--router-mode", "kv", "--use-remote-indexer",
                                 "--tcp-rpc-port", str(router_port), *flags], env))
    procs.append(Proc("frontend", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                                   "--use-remote-router", "on", *flags], env))
    mesh = Mesh(f"http://127.0.0.1:{port}", procs, namespace)
    try:
        wait_ready(mesh.base_url, "tiny", 2, procs)
        wait_until(lambda: chat(mesh), timeout=30, what="a chat completion through the router replica")
        stream = mesh.client().chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "stream it"}], max_tokens=6, stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        pb = proto_stubs()
        for p in worker_ports:
            assert_only_the_mesh_gets_in(
                f"127.0.0.1:{p}",
                lambda ch: pb["worker_pb2_grpc"].WorkerStub(ch).GetLoad(pb["worker_pb2"].GetLoadRequest(),
                                                                         timeout=5), pki)
        assert_only_the_mesh_gets_in(
            f"127.0.0.1:{router_port}",
            lambda ch: pb["router_pb2_grpc"].RouterStub(ch).GetBusyThresholds(
                pb["router_pb2"].GetBusyThresholdsRequest(), timeout=5), pki)
        assert_only_the_mesh_gets_in(
            f"127.0.0.1:{indexer_port}",
            lambda ch: pb["indexer_pb2_grpc"].IndexerStub(ch).Status(pb["indexer_pb2"].StatusRequest(),
                                                                      timeout=5), pki)
        # The mesh still routes by cache over TLS (the router asks the remote indexer).
        assert_prefix_follows_the_cache(mesh, BLOCK, seed=5)
        chat(mesh)
    except BaseException:
        mesh.print_logs()
        raise
    finally:
        mesh.stop()


def peer_serial(address, pki, pair):
    """The serial number of the certificate the server at `address` presents, verified against
    the mesh CA, connecting with the client certificate `pair`. The server's HTTP/2 SETTINGS are
    read too: under TLS 1.3 a refused client certificate shows only on the first read."""
    context = ssl.create_default_context(cafile=str(pki.pem))
    context.load_cert_chain(str(pair[0]), str(pair[1]))
    context.set_alpn_protocols(["h2"])
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            frame = tls.recv(9)
            if len(frame) < 9 or frame[3] != 4:
                raise ConnectionError(f"no HTTP/2 SETTINGS from {address}: {frame!r}")
            return int(tls.getpeercert()["serialNumber"], 16)


def replace(sources, targets):
    # Written beside and renamed over, as a certificate manager does.
    for source, target in zip(sources, targets):
        shutil.copy(source, target.with_suffix(".tmp"))
        target.with_suffix(".tmp").replace(target)


def test_certificate_files_are_replaced_while_serving(pki):
    """A worker's server certificate and its client CA change on disk: new connections get the
    new certificate, and a client CA swapped for another CA's admits that CA's members only;
    the process is the same throughout."""
    live = pki.tmp / f"live-{uuid.uuid4().hex[:6]}"
    live.mkdir()
    cert, key, client_ca = live / "tls.crt", live / "tls.key", live / "client-ca.pem"
    replace([*pki.member, pki.pem], [cert, key, client_ca])
    port = free_port()
    worker = Proc("mocker", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                             "--discovery-backend", "mem", "--tcp-rpc-port", str(port),
                             "--tcp-tls-cert-path", str(cert), "--tcp-tls-key-path", str(key),
                             "--tcp-tls-client-ca-cert-path", str(client_ca)])
    address = f"127.0.0.1:{port}"
    try:
        first = wait_until(lambda: peer_serial(address, pki, pki.member), what="the worker serving TLS")
        assert first == 101
        replace(pki.renewed, [cert, key])
        wait_until(lambda: peer_serial(address, pki, pki.member) == 202, timeout=15,
                   what="the renewed certificate served")
        # A half-written pair (a key that does not match) keeps the loaded one.
        shutil.copy(pki.outsider[1], key)
        time.sleep(3)
        assert peer_serial(address, pki, pki.member) == 202
        replace(pki.renewed, [cert, key])
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            peer_serial(address, pki, pki.outsider)
        replace([pki.other.pem], [client_ca])
        wait_until(lambda: peer_serial(address, pki, pki.outsider) == 202, timeout=15,
                   what="the other CA's member admitted after the client CA changed")
        assert worker.alive(), worker.output()[-2000:]
        assert "reload failed" in worker.output()
    finally:
        worker.kill()


def test_kvmesh_up_serves_with_mesh_tls(pki):
    """`kvmesh up` passes the flags to its embedded services: its internal gRPC port (the
    indexer) speaks mTLS, and the mesh serves the openai SDK."""
    port, rpc_port = free_port(), free_port()
    up = Proc("up", ["kvmesh", "up", "--http-host", "127.0.0.1", "--http-port", str(port), "--num-workers", "2",
                     "--speedup-ratio", "100", "--tcp-rpc-port", str(rpc_port), *mesh_flags(pki)])
    mesh = Mesh(f"http://127.0.0.1:{port}", [up])
    try:
        wait_ready(mesh.base_url, "tiny", 2, [up])
        chat(mesh)
        pb = proto_stubs()
        assert_only_the_mesh_gets_in(
            f"127.0.0.1:{rpc_port}",
            lambda ch: pb["indexer_pb2_grpc"].IndexerStub(ch).Status(pb["indexer_pb2"].StatusRequest(),
                                                                      timeout=5), pki)
    finally:
        mesh.stop()


class NatsServer:
    """A nats-server with JetStream on a free port, killed at the end; `config`, when given, is
    the text of its configuration file."""

    def __init__(self, *args, config=None):
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="kvmesh-nats-")
        self.log = open(Path(self.dir) / "nats.log", "w")
        if config:
            (Path(self.dir) / "nats.conf").write_text(config)
            args = ("-c", str(Path(self.dir) / "nats.conf"), *args)
        self.proc = subprocess.Popen(["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js",
                                      "-sd", self.dir, *args], stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: socket.create_connection(("127.0.0.1", self.port), timeout=1).close() or True,
                   what="nats-server listening")

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def nats_tls_args(pki):
    return ["--tls", "--tlscert", str(pki.member[0]), "--tlskey", str(pki.member[1]),
            "--tlsverify", "--tlscacert", str(pki.pem)]


def nats_tls_env(pki):
    return {"NATS_TLS_CA_CERT_PATH": str(pki.pem), "NATS_TLS_CLIENT_CERT_PATH": str(pki.member[0]),
            "NATS_TLS_CLIENT_KEY_PATH": str(pki.member[1])}


def nats_server_with(auth, pki):
    """A nats-server demanding TLS, a client certificate of the mesh CA and `auth`; returns it,
    the environment that authenticates, and one with a wrong secret or key."""
    secret = uuid.uuid4().hex
    if auth == "user_password":
        server = NatsServer(*nats_tls_args(pki), "--user", "kvmesh", "--pass", secret)
        env = {"NATS_AUTH_USERNAME": "kvmesh", "NATS_AUTH_PASSWORD": secret}
        return server, env, {**env, "NATS_AUTH_PASSWORD": "wrong"}
    if auth == "token":
        server = NatsServer(*nats_tls_args(pki), "--auth", secret)
        return server, {"NATS_AUTH_TOKEN": secret}, {"NATS_AUTH_TOKEN": "wrong"}
    if auth == "nkey":
        # The server knows the user by its public key; the client signs the server's nonce with
        # the seed. Another user's seed is refused.
        user = NKey("user")
        server = NatsServer(*nats_tls_args(pki), config=f"authorization {{ users: [{{nkey: {user.public}}}] }}\n")
        return server, {"NATS_AUTH_NKEY": user.seed}, {"NATS_AUTH_NKEY": NKey("user").seed}
    # Operator mode: the server trusts the operator, which signed the account (JetStream on),
    # which signed the user's JWT; the client presents the JWT and signs the nonce with the seed
    # of its credentials file. The same JWT with another seed is refused.
    operator = Operator()
    user, token = operator.user()
    server = NatsServer(*nats_tls_args(pki), config=operator.config())
    files = {}
    for name, seed in (("kvmesh", user.seed), ("wrong", NKey("user").seed)):
        files[name] = Path(server.dir) / f"{name}.creds"
        files[name].write_text(creds(token, seed))
    return (server, {"NATS_AUTH_CREDENTIALS_FILE": str(files["kvmesh"])},
            {"NATS_AUTH_CREDENTIALS_FILE": str(files["wrong"])})


@pytest.mark.parametrize("auth", ["user_password", "token", "nkey", "creds_file"])
def test_kv_routing_through_nats_with_tls_and_credentials(pki, auth, monkeypatch):
    """KV events reach the frontend's index through a nats-server that demands TLS, a client
    certificate of the mesh CA and a password, a token, an NKey or a credentials file (a JWT of
    an operator-mode server); a process with the wrong secret or key does not start."""
    server, env, wrong = nats_server_with(auth, pki)
    monkeypatch.setenv("NATS_SERVER", f"nats://127.0.0.1:{server.port}")
    try:
        mesh = start_distributed("etcd", {**env, **nats_tls_env(pki)}, frontend_args=["--router-mode", "kv"])
        try:
            assert_prefix_follows_the_cache(mesh, BLOCK, seed=3)
            chat(mesh)
        finally:
            mesh.stop()
        refused = Proc("refused", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                                   "--discovery-backend", "file", "--tcp-rpc-port", str(free_port())],
                       {**wrong, **nats_tls_env(pki), "NATS_SERVER": f"nats://127.0.0.1:{server.port}"})
        try:
            wait_until(lambda: not refused.alive(), timeout=30, what="the mocker with a wrong secret exiting")
        finally:
            refused.kill()
        assert refused.proc.returncode != 0
        assert "nats" in refused.output().lower(), refused.output()[-2000:]
        # Refused for its credentials (not for its certificate, say).
        assert "authentication error" in Path(server.log.name).read_text()
    finally:
        server.stop()


class EtcdServer:
    """An etcd serving clients over TLS with client-certificate authentication on a free port."""

    def __init__(self, pki):
        self.port, peer = free_port(), free_port()
        self.dir = tempfile.mkdtemp(prefix="kvmesh-etcd-")
        self.url = f"https://127.0.0.1:{self.port}"
        self.pki = pki
        self.log = open(Path(self.dir) / "etcd.log", "w")
        self.proc = subprocess.Popen(
            ["etcd", "--name", "tls", "--data-dir", f"{self.dir}/data",
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", f"tls=http://127.0.0.1:{peer}",
             "--cert-file", str(pki.member[0]), "--key-file", str(pki.member[1]),
             "--trusted-ca-file", str(pki.pem), "--client-cert-auth"],
            stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: self.post("/v3/maintenance/status", {}).status_code == 200, what="etcd serving TLS")

    def post(self, path, body, token=None):
        headers = {"Authorization": token} if token else {}
        return requests.post(f"{self.url}{path}", json=body, verify=str(self.pki.pem), headers=headers,
                             cert=(str(self.pki.member[0]), str(self.pki.member[1])), timeout=5)

    def enable_auth(self, user, password):
        """`etcdctl user add root`, `role add root`, `user grant-role root root`, `auth enable`, over
        etcd's JSON gateway."""
        for path, body in [("/v3/auth/user/add", {"name": user, "password": password}),
                           ("/v3/auth/role/add", {"name": "root"}),
                           ("/v3/auth/user/grant", {"user": user, "role": "root"}),
                           ("/v3/auth/enable", {})]:
            r = self.post(path, body)
            assert r.status_code == 200, (path, r.text)
        # Anonymous requests are now refused.
        assert self.post("/v3/kv/range", {"key": "YQ=="}).status_code != 200

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def test_discovery_through_etcd_with_tls_and_a_password(pki, monkeypatch):
    """Workers register and the frontend discovers them through an etcd that demands TLS, a
    client certificate of the mesh CA and a password; a wrong password does not start."""
    etcd = EtcdServer(pki)
    password = uuid.uuid4().hex
    try:
        etcd.enable_auth("root", password)
        monkeypatch.setenv("ETCD_ENDPOINTS", etcd.url)
        env = {"ETCD_AUTH_CA": str(pki.pem), "ETCD_AUTH_CLIENT_CERT": str(pki.member[0]),
               "ETCD_AUTH_CLIENT_KEY": str(pki.member[1]), "ETCD_AUTH_USERNAME": "root",
               "ETCD_AUTH_PASSWORD": password}
        mesh = start_distributed("etcd", env)
        try:
            chat(mesh)
        finally:
            mesh.stop()
        refused = Proc("refused", ["kvmesh-mocker", "--model-path", str(TINY_MODEL), "--model-name", "tiny",
                                   "--discovery-backend", "etcd", "--tcp-rpc-port", str(free_port())],
                       {**env, "ETCD_AUTH_PASSWORD": "wrong", "ETCD_ENDPOINTS": etcd.url})
        try:
            wait_until(lambda: not refused.alive(), timeout=30, what="the mocker with a wrong password exiting")
        finally:
            refused.kill()
        assert refused.proc.returncode != 0
        assert "etcd" in refused.output().lower(), refused.output()[-2000:]
    finally:
        etcd.stop()
