"""A real engine behind a worker written in Python: two `kvmesh-vllm-worker` processes (vLLM's CPU
build, workers/vllm) registered in real etcd, their KV events relayed over real NATS, behind
`kvmesh-frontend --router-mode kv`, driven by the official openai SDK."""
import os
import signal
import time

import grpc
import pytest

from conftest import (BIN_DIR, Mesh, Proc, complete_on, free_port, proto_stubs, require_env, wait_ready,
                      wait_until)
from worker_impls import BLOCK_SIZE


@pytest.fixture(scope="module")
def vllm_mesh(vllm_workers, mesh_pki):
    namespace = vllm_workers[0].namespace
    # The workers serve mutual TLS: the frontend and the indexer are members of the same mesh CA.
    env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
           "NATS_SERVER": require_env("NATS_SERVER"), **mesh_pki.mesh_env()}
    port = free_port()
    indexer_port = free_port()
    frontend = Proc("frontend-vllm", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                                      "--namespace", namespace, "--router-mode", "kv"], env)
    indexer = Proc("indexer-vllm", ["kvmesh-indexer", "--tcp-rpc-port", str(indexer_port)],
                   {**env, "DYN_NAMESPACE": namespace})
    mesh = Mesh(f"http://127.0.0.1:{port}", [frontend, indexer], namespace)
    mesh.workers = vllm_workers
    mesh.pki = mesh_pki
    mesh.indexer_rpc = f"127.0.0.1:{indexer_port}"
    try:
        wait_ready(mesh.base_url, "tiny", 2, [frontend, indexer])
        yield mesh
    except BaseException:
        mesh.print_logs()
        raise
    finally:
        mesh.stop()


def test_openai_sdk_unary_and_streamed_chat(vllm_mesh):
    client = vllm_mesh.client()
    reply = client.chat.completions.create(model="tiny", max_tokens=8,
                                           messages=[{"role": "user", "content": "hello from the sdk"}])
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert reply.usage.completion_tokens >= 1 and reply.usage.prompt_tokens > 4
    chunks = list(client.chat.completions.create(model="tiny", max_tokens=8, stream=True,
                                                 messages=[{"role": "user", "content": "stream please"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text and finishes and finishes[-1] in ("length", "stop"), chunks[-3:]


def find_matches(mesh, prompt):
    pb = proto_stubs()
    with mesh.pki.channel(mesh.indexer_rpc) as channel:
        stub = pb["indexer_pb2_grpc"].IndexerStub(channel)
        return stub.FindMatches(pb["indexer_pb2"].FindMatchesRequest(model="tiny", token_ids=prompt), timeout=5)


def test_shared_prefix_goes_to_the_worker_that_holds_it(vllm_mesh):
    prefix = [10 + (i * 13) % 2900 for i in range(8 * BLOCK_SIZE)]
    first = complete_on(vllm_mesh, prefix + [1, 2, 3])

    def indexed():
        scores = {s.worker_id: s.device_blocks for s in find_matches(vllm_mesh, prefix).scores}
        return scores.get(first, 0) >= 8 and scores

    # vLLM's events reached the index through the bridge, under the worker's id.
    scores = wait_until(indexed, timeout=15, what="the first request's blocks in the index")
    assert scores[first] >= 8
    for i in range(4):
        assert complete_on(vllm_mesh, prefix + [40 + i, 50 + i]) == first


def test_the_worker_admits_only_members_of_the_mesh_ca(vllm_mesh):
    """`--tcp-tls-*` on the Python worker: a certificate of the mesh CA gets in (as the Rust
    frontend's did for every request above); another CA's certificate, none, or plaintext do not."""
    pb = proto_stubs()
    worker = vllm_mesh.workers[0]
    request = pb["worker_pb2"].GetLoadRequest()

    def get_load(channel):
        with channel:
            return pb["worker_pb2_grpc"].WorkerStub(channel).GetLoad(request, timeout=5)

    assert get_load(worker.channel()).ranks[0].worker_id == worker.instance_id
    refused = {
        "another CA": vllm_mesh.pki.channel(worker.address, vllm_mesh.pki.outsider),
        "plaintext": grpc.insecure_channel(worker.address),
        "no certificate": grpc.secure_channel(worker.address, grpc.ssl_channel_credentials(
            root_certificates=vllm_mesh.pki.ca.pem.read_bytes())),
    }
    for name, channel in refused.items():
        with pytest.raises(grpc.RpcError) as caught:
            get_load(channel)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, (name, caught.value)


def test_builtin_vllm_processor_serves_chat_in_front_of_the_workers(vllm_mesh):
    """`--dyn-chat-processor vllm`: the frontend spawns a processor host in the vLLM environment,
    which templates, tokenizes and detokenizes with vLLM's own code; the workers generate."""
    from pathlib import Path
    import openai

    from worker_impls import vllm_python
    env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": require_env("ETCD_ENDPOINTS"),
           "NATS_SERVER": require_env("NATS_SERVER"), "VIRTUAL_ENV": str(Path(vllm_python()).parent.parent),
           "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", **vllm_mesh.pki.mesh_env()}
    port = free_port()
    frontend = Proc("frontend-vllm-processor", ["kvmesh-frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
                                                "--namespace", vllm_mesh.namespace, "--router-mode", "kv",
                                                "--dyn-chat-processor", "vllm"], env)
    try:
        wait_ready(f"http://127.0.0.1:{port}", "tiny", 1, [frontend], timeout=120)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "hello through vLLM's processor"}]
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                               extra_body={"ignore_eos": True})
        text = reply.choices[0].message.content
        assert reply.choices[0].finish_reason == "length", reply
        assert reply.usage.completion_tokens == 12 and text, reply
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=12, temperature=0, stream=True,
            extra_body={"ignore_eos": True}) if c.choices)
        # The same greedy tokens, detokenized incrementally, give the same text.
        assert streamed == text
        # A stop string taken from that text ends the output just before it.
        stop = text[len(text) // 2:len(text) // 2 + 3]
        if stop.strip():
            cut = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                                 stop=[stop], extra_body={"ignore_eos": True})
            assert cut.choices[0].finish_reason == "stop", cut
            assert cut.choices[0].message.content == text[:text.index(stop)]
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=-3)
    except BaseException:
        print(frontend.output()[-6000:])
        raise
    finally:
        frontend.stop()


def descendants(pid):
    """(pid, command line) of every process below `pid`."""
    out = []
    for child in os.popen(f"pgrep -P {pid}").read().split():
        try:
            cmdline = open(f"/proc/{child}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
            comm = open(f"/proc/{child}/comm").read().strip()
        except OSError:
            continue
        out.append((int(child), f"{comm} {cmdline}"))
        out.extend(descendants(int(child)))
    return out


def alive(pid):
    """Whether `pid` runs (a zombie waiting for its parent does not)."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigkill_removes_a_worker_within_the_lease_ttl(vllm_mesh):
    victim, survivor = vllm_mesh.workers[1], vllm_mesh.workers[0]
    children = descendants(victim.proc.proc.pid)
    names = {pid: name for pid, name in children}
    assert any("kvmesh-kv-bridge" in n for n in names.values()), names
    assert any("EngineCore" in n for n in names.values()), names
    victim.proc.kill(signal.SIGKILL)
    started = time.monotonic()

    # Neither the bridge nor vLLM's engine processes outlive the worker.
    wait_until(lambda: not [pid for pid in names if alive(pid)], timeout=15,
               what=f"the killed worker's children {names} to exit")

    def only_survivor():
        import requests
        body = requests.get(f"{vllm_mesh.base_url}/health", timeout=2).json()
        return body.get("num_instances") == 1

    wait_until(only_survivor, timeout=20, what="the killed worker to leave routing")
    assert time.monotonic() - started < 20
    for i in range(4):
        assert complete_on(vllm_mesh, [100 + i] * 40) == survivor.instance_id
