"""Real processes: a pyzmq PUB socket writing exactly the frames vLLM writes, the kvmesh-kv-bridge
binary, and a real NATS JetStream read back with nats-py. Checks the republished KvEventBatch
stream: gap-free event ids from 0, kvmesh tokens_hash of the token ids, parents mapped, malformed
frames and sequence gaps counted and skipped, and the bridge still alive."""
import asyncio
import json
import os
import random
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgpack
import pytest
import requests
import xxhash
import zmq

from conftest import ROOT, Proc, free_port, require_env, wait_until

VECTORS = ROOT / "services" / "kv-bridge" / "tests" / "data" / "vllm-0.32-kv-event-frames.json"
BLOCK_SIZE = 32
MODEL = "Qwen/Qwen3-0.6B"
TOPIC = b"kv-events"

_STUBS = {}


def events_pb2():
    """KvEventBatch stubs generated with grpcio-tools' bundled protoc."""
    if not _STUBS:
        from grpc_tools import protoc
        import grpc_tools
        out_dir = Path(tempfile.mkdtemp())
        include = str(Path(grpc_tools.__file__).parent / "_proto")
        rc = protoc.main(["protoc", f"-I{ROOT / 'proto'}", f"-I{include}", f"--python_out={out_dir}",
                          "kvmesh/v1/events.proto"])
        assert rc == 0
        sys.path.insert(0, str(out_dir))
        from kvmesh.v1 import events_pb2 as module
        _STUBS["events_pb2"] = module
    return _STUBS["events_pb2"]


# --- what vLLM writes (vllm/distributed/kv_events.py, msgspec with omit_defaults) -----------------

def block_stored(block_hashes, parent, token_ids, group_idx=0):
    return {"type": "BlockStored", "block_hashes": block_hashes, "parent_block_hash": parent,
            "token_ids": token_ids, "block_size": BLOCK_SIZE, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": [None] * len(block_hashes), "group_idx": group_idx,
            "kv_cache_spec_kind": "full_attention"}


def block_removed(block_hash):
    return {"type": "BlockRemoved", "block_hashes": [block_hash], "medium": "GPU", "group_idx": 0}


def all_cleared():
    return {"type": "AllBlocksCleared"}


def frames(seq, events):
    payload = msgpack.packb([time.time(), events, 0])
    return [TOPIC, struct.pack(">Q", seq), payload]


def engine_hash():
    """vLLM's block hashes are truncated sha256 values, often above 2**63."""
    return random.getrandbits(64) | (1 << 63)


# --- kvmesh hashing (docs/kv-events.md, "Hashing") ------------------------------------------------

def local_hashes(tokens):
    blocks = [tokens[i:i + BLOCK_SIZE] for i in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE)]
    return [xxhash.xxh3_64_intdigest(struct.pack(f"<{len(b)}I", *b), seed=1337) for b in blocks]


def partition(worker_id, partitions=16):
    return xxhash.xxh3_64_intdigest(struct.pack("<Q", worker_id), seed=0) % partitions


def test_python_frames_equal_the_captured_vllm_frames():
    """The test's encoder writes byte for byte what a real vLLM 0.32 engine wrote."""
    for vector in json.loads(VECTORS.read_text()):
        assert msgpack.packb(vector["decoded"]).hex() == vector["frames_hex"][2], vector["what"]
        assert struct.pack(">Q", vector["seq"]).hex() == vector["frames_hex"][1]


def test_golden_hashes_in_python():
    assert xxhash.xxh3_64_intdigest(struct.pack("<4I", 1, 2, 3, 4), seed=1337) == 14643705804678351452
    assert partition(1) == 14 and partition(2) == 3 and partition(42) == 8


def metrics(port):
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def read_batches(namespace, count, timeout=20):
    """KvEventBatch messages of the namespace's stream until `count` events arrived."""
    import nats
    pb = events_pb2()

    async def read():
        nc = await nats.connect(os.environ["NATS_SERVER"])
        js = nc.jetstream()
        sub = await js.subscribe(f"kvmesh.{namespace}.kv.>", ordered_consumer=True)
        batches, num_events = [], 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and num_events < count:
            try:
                msg = await sub.next_msg(timeout=1)
            except nats.errors.TimeoutError:
                continue
            batch = pb.KvEventBatch()
            batch.ParseFromString(msg.data)
            batches.append((msg.subject, batch))
            num_events += len(batch.events)
        await nc.close()
        return batches

    return asyncio.run(read())


@pytest.mark.parametrize("engine_binds", [True, False], ids=["engine-binds", "engine-connects"])
def test_bridge_republishes_vllm_events(engine_binds):
    nats_server = require_env("NATS_SERVER")
    namespace = f"t{uuid.uuid4().hex[:10]}"
    worker_id = random.getrandbits(63)
    port, metrics_port = free_port(), free_port()
    endpoint = f"tcp://127.0.0.1:{port}"

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    args = ["kvmesh-kv-bridge", "--worker-id", str(worker_id), "--namespace", namespace,
            "--model-name", MODEL, "--block-size", str(BLOCK_SIZE), "--zmq-endpoint", endpoint,
            "--metrics-port", str(metrics_port)]
    if engine_binds:  # vLLM's default `tcp://*:5557`: the engine binds, the bridge connects
        pub.bind(f"tcp://*:{port}")
    else:  # vLLM with `tcp://127.0.0.1:P` connects, so the bridge binds
        args.append("--zmq-bind")
    # Discovery is unused; any backend but mem selects the NATS event plane.
    floor = (time.time_ns() // 1_000_000) << 16
    bridge = Proc("kv-bridge", args, {"NATS_SERVER": nats_server, "DYN_DISCOVERY_BACKEND": "etcd"})
    try:
        wait_until(lambda: bridge.alive() and metrics(metrics_port), timeout=30, what="bridge metrics")
        if not engine_binds:
            pub.connect(endpoint)

        # PUB drops what it sends before the subscription arrives: send events the bridge skips
        # (a non-main KV group, as hybrid models emit) until it has received one.
        seq = 0
        def probe():
            nonlocal seq
            assert bridge.alive(), bridge.output()[-3000:]
            pub.send_multipart(frames(seq, [block_stored([engine_hash()], None, [0] * BLOCK_SIZE, 1)]))
            seq += 1
            return metrics(metrics_port).get("kvmesh_adapter_zmq_batches_total", 0) >= 1
        wait_until(probe, timeout=30, interval=0.05, what="bridge subscribed")

        prompt = [random.randrange(1, 50000) for _ in range(3 * BLOCK_SIZE + 5)]
        prefill = [engine_hash() for _ in range(3)]
        decoded = prompt[3 * BLOCK_SIZE:] + [random.randrange(1, 50000) for _ in range(BLOCK_SIZE - 5)]
        decode_block = engine_hash()
        shared = prompt[:BLOCK_SIZE] + [7] * BLOCK_SIZE
        shared_block = engine_hash()

        # Prefill after a cache reset: cleared + 3 blocks from the root (one batch, as captured).
        pub.send_multipart(frames(seq, [all_cleared(), block_stored(prefill, None, prompt[:3 * BLOCK_SIZE])]))
        # A block completed during decode, chained to the last prefill block.
        pub.send_multipart(frames(seq + 1, [block_stored([decode_block], prefill[2], decoded)]))
        # Malformed: a payload that is not msgpack, and a message with two frames.
        pub.send_multipart([TOPIC, struct.pack(">Q", seq + 2), b"\xc1 not msgpack"])
        pub.send_multipart([TOPIC, b"\x00\x01"])
        # seq + 3 is lost. Then evictions in LRU order before the store that reuses the space.
        pub.send_multipart(frames(seq + 4, [block_removed(decode_block), block_removed(prefill[2]),
                                            block_stored([shared_block], prefill[0], shared[BLOCK_SIZE:])]))
        pub.send_multipart(frames(seq + 5, [all_cleared()]))

        expected_kinds = ["cleared", "stored", "stored", "removed", "removed", "stored", "cleared"]
        batches = read_batches(namespace, len(expected_kinds))
        events = [e for _, batch in batches for e in batch.events]
        ids = [e.event_id for e in events]
        # A worker without earlier ids starts at the clock's floor (ms since the epoch << 16), then
        # counts without gaps.
        assert ids[0] >= floor, (ids, floor)
        assert ids == list(range(ids[0], ids[0] + len(expected_kinds))), "gap-free ids"
        assert [e.WhichOneof("kind") for e in events] == expected_kinds
        subject = f"kvmesh.{namespace}.kv.Qwen~2FQwen3-0~2E6B.{partition(worker_id)}"
        for got_subject, batch in batches:
            assert got_subject == subject
            assert batch.worker_id == worker_id and batch.dp_rank == 0 and not batch.worker_removed

        first = events[1].stored
        assert not first.HasField("parent_hash")
        assert [b.block_hash for b in first.blocks] == prefill
        assert [b.tokens_hash for b in first.blocks] == local_hashes(prompt)
        second = events[2].stored
        assert second.parent_hash == prefill[2]
        assert [(b.block_hash, b.tokens_hash) for b in second.blocks] == [(decode_block, local_hashes(decoded)[0])]
        assert list(events[3].removed.block_hashes) == [decode_block]
        assert list(events[4].removed.block_hashes) == [prefill[2]]
        third = events[5].stored
        assert third.parent_hash == prefill[0]
        assert third.blocks[0].tokens_hash == local_hashes(shared)[1]
        assert all(e.tier == 0 for e in events), "GPU is the device tier"

        values = metrics(metrics_port)
        assert values['kvmesh_adapter_malformed_total{kind="payload"}'] == 1
        assert values['kvmesh_adapter_malformed_total{kind="frame"}'] == 1
        assert values["kvmesh_adapter_zmq_gaps_total"] == 1
        assert values["kvmesh_adapter_zmq_missed_batches_total"] == 1
        assert values["kvmesh_adapter_events_published_total"] == len(expected_kinds)
        assert bridge.alive(), "malformed frames are never fatal"
        bridge.stop()
        assert bridge.proc.returncode == 0, bridge.output()[-3000:]
    except BaseException:
        print(f"--- bridge ---\n{bridge.output()[-4000:]}")
        raise
    finally:
        bridge.kill()
        pub.close(linger=0)
        ctx.term()
