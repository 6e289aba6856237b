#!/usr/bin/env python3
"""Writes the hand-made seeds of every fuzz corpus (fuzz/corpus/<target>/seed-*), shaped like what
real clients, engines and processes send. Inputs a fuzzer found are added next to them by
scripts/fuzz.sh --merge. Needs msgpack and tritonclient (tests/python/requirements.txt)."""

import json
import os
import struct
import sys

import msgpack
from tritonclient.grpc import service_pb2 as kserve

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    folder = os.path.join(ROOT, target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, (dict, list)):
        data = json.dumps(data).encode()
    elif isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, "seed-" + name), "wb") as out:
        out.write(data)


def chat():
    t = "openai_chat"
    write(t, "basic", {"model": "tiny", "messages": [{"role": "user", "content": "Hello!"}]})
    write(t, "stream-sampling", {
        "model": "tiny", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 16, "max_completion_tokens": 16, "temperature": 0.7, "top_p": 0.9,
        "top_k": 40, "min_p": 0.05, "n": 2, "seed": 7, "stop": ["\n\n", "END"],
        "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
        "logprobs": True, "top_logprobs": 3, "ignore_eos": False, "min_tokens": 1,
        "user": "u-1", "cache_salt": "tenant-a"})
    write(t, "tools", {
        "model": "tiny", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "w",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False, "response_format": {"type": "json_object"}})
    write(t, "legacy-functions", {
        "model": "tiny", "messages": [{"role": "user", "content": "x"}],
        "functions": [{"name": "f", "parameters": {"type": "object"}}], "function_call": "auto"})
    write(t, "nvext", {
        "model": "tiny", "messages": [{"role": "user", "content": "x"}],
        "nvext": {"backend_instance_id": 17, "priority": 3, "extra_fields": ["worker_id"],
                  "annotations": ["request_id"], "ignore_eos": True},
        "chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "low"})
    write(t, "bad-n", {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "n": 1000})
    write(t, "not-json", "{\"model\": \"tiny\", \"messages\": [")
    write(t, "wrong-types", {"model": 5, "messages": "hi", "temperature": "hot"})


def completions():
    t = "openai_completions"
    write(t, "text", {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 8})
    write(t, "tokens", {"model": "tiny", "prompt": [1, 2, 3, 4294967295], "echo": True, "logprobs": 2})
    write(t, "token-lists", {"model": "tiny", "prompt": [[1, 2], [3]], "stream": True})
    write(t, "strings", {"model": "tiny", "prompt": ["a", "b"], "suffix": "z", "best_of": 2})
    write(t, "bad-prompt", {"model": "tiny", "prompt": [1, "a", [2]]})
    write(t, "too-big-token", {"model": "tiny", "prompt": [4294967296]})
    write(t, "nvext", {"model": "tiny", "prompt": "x", "nvext": {"backend_instance_id": "x"},
                       "stop": "\n", "seed": -1, "temperature": 2.5})


def responses():
    t = "openai_responses"
    write(t, "text", {"model": "tiny", "input": "Tell me a joke", "max_output_tokens": 32})
    write(t, "items", {
        "model": "tiny", "instructions": "Be brief.", "stream": True,
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                  {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "42"}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": "auto", "temperature": 0.2, "top_p": 0.5,
        "reasoning": {"effort": "low"}, "text": {"format": {"type": "text"}}})
    write(t, "previous-id", {"model": "tiny", "input": "x", "previous_response_id": "resp_1"})
    write(t, "bad-input", {"model": "tiny", "input": 7})


def messages():
    t = "anthropic_messages"
    write(t, "basic", {"model": "tiny", "max_tokens": 64,
                       "messages": [{"role": "user", "content": "Hello"}]})
    write(t, "blocks", {
        "model": "tiny", "max_tokens": 64, "stream": True, "temperature": 0.5, "top_k": 5,
        "stop_sequences": ["END"],
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1;\nBe nice."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "weather?"},
                                         {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                              {"type": "tool_use", "id": "t1", "name": "w", "input": {"c": 1}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}],
        "tools": [{"name": "w", "description": "d", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "tool", "name": "w"}, "thinking": {"type": "enabled", "budget_tokens": 100}})
    write(t, "missing-max-tokens", {"model": "tiny", "messages": [{"role": "user", "content": "x"}]})
    write(t, "bad-role", {"model": "tiny", "max_tokens": 1, "messages": [{"role": "system", "content": "x"}]})


def kserve_infer():
    t = "kserve_infer"

    def request(name, raw, inputs, params=None):
        req = kserve.ModelInferRequest(model_name="tiny", id="req-1")
        for input_name, datatype, value in inputs:
            tensor = req.inputs.add(name=input_name, datatype=datatype, shape=[1])
            if raw:
                if datatype == "BYTES":
                    req.raw_input_contents.append(struct.pack("<I", len(value)) + value)
                else:
                    req.raw_input_contents.append(bytes([value]))
            elif datatype == "BYTES":
                tensor.contents.bytes_contents.append(value)
            else:
                tensor.contents.bool_contents.append(value)
        for key, (kind, value) in (params or {}).items():
            setattr(req.parameters[key], kind, value)
        write(t, name, req.SerializeToString())

    request("typed", False, [("text_input", "BYTES", b"Hello")])
    request("raw-streaming", True, [("text_input", "BYTES", b"Hello"), ("streaming", "BOOL", 1)])
    request("params", False, [("text_input", "BYTES", b"Hi"), ("stream", "BOOL", False)], {
        "max_tokens": ("int64_param", 8), "temperature": ("double_param", 0.5),
        "top_p": ("double_param", 0.9), "stop": ("string_param", "\n"), "seed": ("uint64_param", 3),
        "ignore_eos": ("bool_param", True), "x-dynamo-worker-instance-id": ("string_param", "1f"),
        "x-dynamo-request-priority": ("int64_param", 2)})
    request("unknown-input", False, [("prompt", "BYTES", b"x")])
    request("wrong-param", False, [("text_input", "BYTES", b"x")], {"max_tokens": ("string_param", "8")})


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field(number, wire, payload):
    key = varint(number << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def stored_event(event_id, tier, parent, blocks):
    stored = b"" if parent is None else field(1, 0, parent)
    for block_hash, tokens_hash, mm in blocks:
        block = field(1, 0, block_hash) + field(2, 0, tokens_hash)
        for h in mm:
            block += field(3, 0, h)
        stored += field(2, 2, block)
    return field(1, 0, event_id) + field(2, 0, tier) + field(3, 2, stored)


def removed_event(event_id, tier, hashes):
    removed = b"".join(field(1, 0, h) for h in hashes)
    return field(1, 0, event_id) + field(2, 0, tier) + field(4, 2, removed)


def batch(worker, dp_rank, events, removed_worker=False, readmitted_worker=False):
    body = field(1, 0, worker) + field(2, 0, dp_rank)
    for event in events:
        body += field(3, 2, event)
    body += field(4, 0, 1_700_000_000_000)
    if removed_worker:
        body += field(5, 0, 1)
    if readmitted_worker:
        body += field(6, 0, 1)
    return varint(len(body)) + body


def kv_events():
    t = "kv_event_batches"
    chain = [(100 + i, 0xABC0 + i, []) for i in range(4)]
    write(t, "store-chain", batch(1, 0, [stored_event(0, 0, None, chain)]))
    write(t, "store-remove", batch(1, 0, [stored_event(0, 0, None, chain), stored_event(1, 0, 103, [(104, 0xABC4, [9])])])
          + batch(1, 0, [removed_event(2, 0, [101, 104])]))
    write(t, "two-workers-tiers", batch(1, 0, [stored_event(0, 0, None, chain[:2])])
          + batch(2, 1, [stored_event(0, 1, None, chain[:3]), stored_event(1, 2, None, chain[:1])]))
    write(t, "cleared-removed", batch(1, 0, [stored_event(0, 0, None, chain),
                                             field(1, 0, 1) + field(5, 2, b"")])
          + batch(1, 0, [], removed_worker=True))
    write(t, "removed-readmitted", batch(4, 0, [stored_event(0, 0, None, chain)])
          + batch(4, 0, [], removed_worker=True) + batch(4, 0, [stored_event(1, 0, None, chain[:1])])
          + batch(4, 0, [], readmitted_worker=True) + batch(4, 0, [stored_event(9, 0, None, chain[:2])]))
    write(t, "out-of-order", batch(3, 0, [stored_event(5, 0, None, chain), stored_event(2, 0, 999, chain[:1])]))


def delimited(body):
    return varint(len(body)) + body


def load(worker, rank, used, total, running, waiting, prefill):
    return delimited(field(1, 0, worker) + field(2, 0, rank) + field(3, 0, used) + field(4, 0, total)
                     + field(5, 0, running) + field(6, 0, waiting) + field(7, 0, prefill)
                     + field(8, 0, 1_700_000_000_000))


def worker_loads():
    t = "worker_loads"
    write(t, "idle", load(1, 0, 0, 64, 0, 0, 0) + load(2, 0, 0, 64, 0, 0, 0) + load(3, 0, 0, 64, 0, 0, 0))
    write(t, "one-busy", load(1, 0, 63, 64, 8, 4, 5000) + load(2, 0, 10, 64, 1, 0, 0))
    write(t, "all-busy", b"".join(load(w, 0, 64, 64, 30, 30, 1 << 40) for w in (1, 2, 3)))
    write(t, "unknown-and-odd", load(9, 0, 5, 0, 1, 0, 0) + load(1, 7, 1, 1, 1, 1, 1)
          + load(2, 0, 1 << 63, 0, 0xFFFFFFFF, 0xFFFFFFFF, 1 << 63))


def sync_event(router, request, worker, rank, kind, body=b"", forwarded_by=None):
    out = field(1, 2, router.encode()) + field(2, 2, request.encode()) + field(3, 0, worker) + field(4, 0, rank)
    out += field(kind, 2, body)
    if forwarded_by:
        out += field(9, 2, forwarded_by.encode())
    return delimited(out)


def router_sync_events():
    t = "router_sync_events"
    add = b"".join(field(1, 0, h) for h in (11, 12, 13)) + field(2, 0, 1) + field(3, 0, 20) + field(4, 0, 48)
    write(t, "add-prefill-free", sync_event("other", "a", 1, 0, 5, add) + sync_event("other", "a", 1, 0, 6)
          + sync_event("other", "a", 1, 0, 7))
    write(t, "add-never-freed", sync_event("other", "b", 2, 0, 5, add) + sync_event("third", "b", 3, 0, 5, add))
    write(t, "session-bind", sync_event("other", "c", 1, 0, 8, field(1, 2, b"session-1"))
          + sync_event("other", "c", 1, 0, 5, add + field(6, 2, b"lora-a")))
    write(t, "forwarded-own", sync_event("fuzz-self", "r1", 1, 0, 7, forwarded_by="other")
          + sync_event("fuzz-self", "r2", 2, 0, 6, forwarded_by="other"))
    write(t, "unknown-worker-rank", sync_event("other", "d", 99, 0, 5, add) + sync_event("other", "e", 1, 5, 5, add)
          + sync_event("other", "f", 1, 0, 9))


def zmq_message(payload, topic=b"kv-events", seq=1):
    frames = [topic, struct.pack(">Q", seq), payload]
    return b"".join(struct.pack(">H", min(len(f), 0xFFFF)) + f for f in frames)


def zmq():
    t = "zmq_kv_frames"
    tokens = list(range(32))
    stored = ["BlockStored", [11, 12], None, tokens, 16, None, "GPU", None, None, 0, "full_attention"]
    removed = ["BlockRemoved", [12], "GPU", 0]
    write(t, "vllm-array", zmq_message(msgpack.packb([1.5, [stored, removed, ["AllBlocksCleared"]], 0])))
    write(t, "vllm-map", zmq_message(msgpack.packb({
        "ts": 2, "data_parallel_rank": 1, "events": [
            {"type": "BlockStored", "block_hashes": [b"\x00" * 24 + b"\x01" * 8], "parent_block_hash": -5,
             "token_ids": tokens[:16], "block_size": 16, "medium": "CPU", "lora_name": "ad",
             "extra_keys": [[["img-hash", 0]]]},
            {"type": "BlockRemoved", "block_hashes": [1, 2], "medium": None}]})))
    write(t, "sglang-mm", zmq_message(msgpack.packb([3, [["BlockStored", [1], 0, [[1, 2]] * 8, 16, None, None, None,
                                                          [{"mm_hashes": [7, 8]}]]]])))
    write(t, "other-group", zmq_message(msgpack.packb([4, [stored[:9] + [1, "sliding_window"]]])))
    write(t, "short-tokens", zmq_message(msgpack.packb([5, [["BlockStored", [1, 2, 3], None, tokens[:20], 16]]])))
    write(t, "two-frames", struct.pack(">H", 3) + b"top" + struct.pack(">H", 8) + b"\x00" * 8)


def discovery():
    t = "discovery_records"
    instance = {"namespace": "dynamo", "component": "backend", "endpoint": "generate",
                "instance_id": "2a", "address": "127.0.0.1:9000", "transport": "grpc",
                "device_type": "cpu", "metadata": {"kv_events": "nats"}, "version": "0.1.0",
                "started_at_ms": "1700000000000"}
    write(t, "instance", b"/kvmesh/dynamo/instances/backend/generate/2a\n" + json.dumps(instance).encode())
    card = {"display_name": "Qwen/Qwen3-0.6B", "source_path": "/models/qwen", "context_length": 4096,
            "kv_cache_block_size": 16, "migration_limit": 3, "model_type": 3, "model_input": "tokens",
            "lora": {"name": "ad", "max_gpu_lora_count": 2},
            "user_data": {"b": 1, "a": [True, None, "x"]},
            "runtime_config": {"total_kv_blocks": "1024", "max_num_seqs": "64", "data_parallel_size": 2,
                               "reasoning_parser": "qwen3", "runtime_data": {"z": {"y": 1}}}}
    model = {"namespace": "dynamo", "model": "Qwen/Qwen3-0.6B", "instance_id": "2a",
             "component": "backend", "endpoint": "generate", "card": card, "card_checksum": "0"}
    write(t, "model", b"/kvmesh/dynamo/models/Qwen%2FQwen3-0.6B/2a\n" + json.dumps(model).encode())
    write(t, "key-mismatch", b"/kvmesh/other/instances/backend/generate/2a\n" + json.dumps(instance).encode())
    write(t, "delete-only", b"/kvmesh/dynamo/models/a%25b/ff\n")
    write(t, "not-a-key", b"/kvmesh/dynamo/leases/1\n{}")


if __name__ == "__main__":
    for make in (chat, completions, responses, messages, kserve_infer, kv_events, zmq, discovery, worker_loads,
                 router_sync_events):
        make()
    sys.exit(0)
