"""Tenant isolation of the KV cache against `kvmesh up --router-mode kv`: a request's `cache_salt`
(chat and completions body) or `x-tenant-id` header (every generating endpoint; the header wins)
seeds its block hashes in the router and in the mock engine alike, so a prompt is served from the
cache only for the tenant that sent it before, and its KV events carry salted hashes that the
index answers only for the same salt. `DYN_DISABLE_FRONTEND_NVEXT` leaves both in force."""
import time

import anthropic
import grpc
import pytest
import requests

from conftest import Mesh, Proc, free_port, proto_stubs, wait_ready

BLOCK = 64  # the mocker's default block size
SETTLE = 0.5  # a request's stored blocks reach the router's index through the event plane


@pytest.fixture(scope="module", params=["nvext", "nvext-disabled"])
def mesh(request):
    port, rpc_port = free_port(), free_port()
    env = {"DYN_DISABLE_FRONTEND_NVEXT": "1"} if request.param == "nvext-disabled" else None
    proc = Proc(f"up-salt-{request.param}", [
        "kvmesh", "up", "--router-mode", "kv", "--http-host", "127.0.0.1", "--http-port", str(port),
        "--num-workers", "2", "--speedup-ratio", "100", "--tcp-rpc-port", str(rpc_port),
        "--enable-anthropic-api"], env)
    mesh = Mesh(f"http://127.0.0.1:{port}", [proc])
    mesh.indexer_rpc = f"127.0.0.1:{rpc_port}"
    try:
        wait_ready(mesh.base_url, "tiny", 2, [proc])
        yield mesh
    finally:
        mesh.stop()


def question(tag):
    # Several KV blocks of prompt, so that a repeat can be served from the cache.
    facts = " ".join(f"Fact {i} about the {tag} tenant is that entry {i} stays private." for i in range(60))
    return [{"role": "user", "content": f"{facts} Summarize the {tag} tenant."}]


def chat_cached(mesh, tag, header=None, body=None):
    """Cached prompt tokens of a chat request (`header`: x-tenant-id; `body`: cache_salt)."""
    payload = {"model": "tiny", "messages": question(tag), "max_tokens": 2}
    if body is not None:
        payload["cache_salt"] = body
    headers = {"x-tenant-id": header} if header is not None else {}
    r = requests.post(f"{mesh.base_url}/v1/chat/completions", json=payload, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    time.sleep(SETTLE)
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_tenant_is_served_from_its_own_cache_only(mesh):
    assert chat_cached(mesh, "alpha", header="tenant-a") == 0
    assert chat_cached(mesh, "alpha", header="tenant-a") > 0
    assert chat_cached(mesh, "alpha", header="tenant-b") == 0
    assert chat_cached(mesh, "alpha") == 0
    assert chat_cached(mesh, "alpha", header="tenant-a") > 0
    assert chat_cached(mesh, "alpha", header="tenant-b") > 0


def test_the_body_cache_salt_is_the_same_salt_as_the_header(mesh):
    assert chat_cached(mesh, "beta", body="tenant-c") == 0
    assert chat_cached(mesh, "beta", header="tenant-c") > 0
    assert chat_cached(mesh, "beta", body="tenant-d") == 0


def test_the_header_wins_over_the_body(mesh):
    assert chat_cached(mesh, "gamma", header="tenant-e") == 0
    assert chat_cached(mesh, "gamma", header="tenant-e", body="tenant-f") > 0
    # Had the body's salt counted above, this prompt would be cached under it by now.
    assert chat_cached(mesh, "gamma", body="tenant-f") == 0


def test_messages_and_responses_take_the_header(mesh):
    claude = anthropic.Anthropic(base_url=mesh.base_url, api_key="unused", max_retries=0)

    def messages(tenant):
        message = claude.messages.create(model="tiny", max_tokens=2, messages=question("delta"),
                                         extra_headers={"x-tenant-id": tenant})
        time.sleep(SETTLE)
        return message.usage.cache_read_input_tokens

    def responses(tenant):
        response = mesh.client().responses.create(model="tiny", max_output_tokens=2,
                                                  input=question("delta"), extra_headers={"x-tenant-id": tenant})
        time.sleep(SETTLE)
        return response.usage.input_tokens_details.cached_tokens

    assert messages("tenant-g") == 0
    assert messages("tenant-g") > 0
    assert messages("tenant-h") == 0
    # The same rendered prompt under the same tenant, through the other API.
    assert responses("tenant-h") > 0
    assert responses("tenant-i") == 0


def test_kv_events_of_a_salted_prompt_carry_salted_hashes(mesh):
    pb = proto_stubs()
    tokens = [40 + (i * 13) % 900 for i in range(4 * BLOCK)]
    for salt_in in [{"headers": {"x-tenant-id": "tenant-j"}}, {"json": {"cache_salt": "tenant-k"}}]:
        body = {"model": "tiny", "prompt": tokens, "max_tokens": 2, **salt_in.get("json", {})}
        r = requests.post(f"{mesh.base_url}/v1/completions", json=body, headers=salt_in.get("headers"), timeout=30)
        assert r.status_code == 200, r.text
    time.sleep(SETTLE)

    def blocks(salt):
        with grpc.insecure_channel(mesh.indexer_rpc) as channel:
            stub = pb["indexer_pb2_grpc"].IndexerStub(channel)
            answer = stub.FindMatches(pb["indexer_pb2"].FindMatchesRequest(
                model="tiny", token_ids=tokens, cache_salt=salt), timeout=5)
        return max((score.device_blocks for score in answer.scores), default=0)

    assert blocks("tenant-j") == 4
    assert blocks("tenant-k") == 4
    assert blocks("") == 0
    assert blocks("tenant-l") == 0
