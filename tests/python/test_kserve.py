"""The KServe v2 gRPC edge (docs/kserve.md) through the official tritonclient (sync, async and
streaming APIs) and a raw grpcio stub: against `kvmesh up --kserve-grpc-port` and against
`kvmesh-frontend --kserve-grpc-server` with mock workers over etcd + NATS."""
import asyncio
import json
import os
import queue
import random
import socket
import struct
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
import tritonclient.grpc.service_pb2 as pb
import tritonclient.grpc.service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from conftest import BIN_DIR, Proc, free_port, start_distributed, wait_until
from test_admission import start_up as start_up_http
from test_distributed import worker_load

WINDOWS = {"DYN_GRPC_INITIAL_CONNECTION_WINDOW_SIZE": "16777216",
           "DYN_GRPC_INITIAL_STREAM_WINDOW_SIZE": "2097152"}


def start_up(name, args, env=None, workers=2):
    """`kvmesh up` with KServe gRPC on its own port (`mesh.grpc`) beside the HTTP edge."""
    grpc_port = free_port()
    mesh = start_up_http(name, ["--kserve-grpc-port", str(grpc_port), *args], env, workers)
    mesh.grpc = f"127.0.0.1:{grpc_port}"
    return mesh


@pytest.fixture(scope="module")
def up_mesh():
    mesh = start_up("up-kserve", ["--speedup-ratio", "100"], WINDOWS)
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module")
def etcd_mesh():
    mesh = start_distributed("etcd", kserve=True)
    yield mesh
    mesh.stop()


@pytest.fixture(params=["up", "etcd"])
def kserve_mesh(request):
    return request.getfixturevalue(f"{request.param}_mesh")


def text_inputs(text, streaming=None):
    prompt = triton.InferInput("text_input", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([text.encode()], dtype=object))
    if streaming is None:
        return [prompt]
    flag = triton.InferInput("streaming", [1], "BOOL")
    flag.set_data_from_numpy(np.array([streaming]))
    return [prompt, flag]


def params(result):
    """Response parameters as plain values."""
    out = {}
    for key, value in result.get_response().parameters.items():
        out[key] = getattr(value, value.WhichOneof("parameter_choice"))
    return out


def metric(mesh, prefix):
    """The sum of every series of `prefix` (a name with some of its labels, e.g.
    'requests_total{model="tiny",endpoint="kserve_infer"')."""
    name, _, labels = prefix.partition("{")
    wanted = [label for label in labels.rstrip("}").split(",") if label]
    total = 0.0
    for line in requests.get(f"{mesh.base_url}/metrics", timeout=5).text.splitlines():
        series, _, value = line.rpartition(" ")
        if series.split("{")[0] == name and all(label in series for label in wanted):
            total += float(value)
    return total


def test_liveness_readiness_metadata_and_config(kserve_mesh):
    client = triton.InferenceServerClient(kserve_mesh.grpc)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny") and client.is_model_ready("tiny", "1")
    assert not client.is_model_ready("nope") and not client.is_model_ready("tiny", "7")
    server = client.get_server_metadata(as_json=True)
    assert server["name"] == "kvmesh" and "model_configuration" in server["extensions"]
    meta = client.get_model_metadata("tiny", as_json=True)
    assert meta["versions"] == ["1"] and meta["platform"] == "dynamo"
    assert [(t["name"], t["datatype"]) for t in meta["inputs"]] == [("text_input", "BYTES"), ("streaming", "BOOL")]
    assert [t["name"] for t in meta["outputs"]] == ["text_output", "finish_reason"]
    config = client.get_model_config("tiny", as_json=True)["config"]
    assert config["backend"] == "dynamo"
    assert {i["name"]: i["data_type"] for i in config["input"]} == {"text_input": "TYPE_STRING", "streaming": "TYPE_BOOL"}
    assert [i.get("optional", False) for i in config["input"]] == [False, True]
    # The side HTTP server (or the full HTTP edge) lists the same model.
    assert [m["id"] for m in requests.get(f"{kserve_mesh.base_url}/v1/models", timeout=5).json()["data"]] == ["tiny"]


def test_unary_infer_with_and_without_parameters(kserve_mesh):
    client = triton.InferenceServerClient(kserve_mesh.grpc)
    result = client.infer("tiny", text_inputs("Hello there, how are you?"), request_id="plain")
    assert result.get_response().id == "plain" and result.get_response().model_version == "1"
    assert result.as_numpy("finish_reason")[0].decode() in ("stop", "length")
    usage = params(result)
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    # tritonclient sends raw contents, so the outputs come back raw.
    assert result.get_response().raw_output_contents and not result.get_response().outputs[0].HasField("contents")
    tuned = client.infer("tiny", text_inputs("Hello there"), parameters={
        "max_tokens": 3, "ignore_eos": True, "temperature": 0.0, "top_p": 0.9, "top_k": 5, "seed": 7,
        "min_tokens": 1, "frequency_penalty": 0.1, "presence_penalty": 0.1, "stop": "zzzz-never"})
    assert tuned.as_numpy("finish_reason")[0] == b"length"
    assert params(tuned)["completion_tokens"] == 3
    # A stop string the greedy answer contains ends it there (finish `stop`, the text before it).
    greedy = {"max_tokens": 24, "ignore_eos": True, "temperature": 0.0}
    full = client.infer("tiny", text_inputs("Hello there"), parameters=greedy).as_numpy("text_output")[0].decode()
    word = full.split()[2]
    stopped = client.infer("tiny", text_inputs("Hello there"), parameters={**greedy, "stop": word})
    assert stopped.as_numpy("finish_reason")[0] == b"stop"
    assert stopped.as_numpy("text_output")[0].decode() == full[:full.index(word)]
    with pytest.raises(InferenceServerException) as bad:
        client.infer("tiny", text_inputs("x"), parameters={"max_tokens": "three"})
    assert bad.value.status() == "StatusCode.INVALID_ARGUMENT" and "max_tokens" in bad.value.message()


def stream_all(client, requests_, timeout=30):
    """Sends every (request_id, inputs, parameters) on one stream; returns (responses by id in
    arrival order, errors)."""
    arrived = queue.Queue()
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    try:
        for request_id, inputs, parameters in requests_:
            client.async_stream_infer("tiny", inputs, request_id=request_id, parameters=parameters)
        by_id, errors = {}, []
        deadline = time.monotonic() + timeout
        finished = lambda: sum(1 for r in by_id.values() if r[-1][1]) + len(errors)  # noqa: E731
        while finished() < len(requests_) and time.monotonic() < deadline:
            try:
                result, error = arrived.get(timeout=0.5)
            except queue.Empty:
                continue
            if error is not None:
                errors.append(error)
                continue
            by_id.setdefault(result.get_response().id, []).append(
                (result.as_numpy("text_output")[0].decode(errors="replace"),
                 result.as_numpy("finish_reason")[0].decode(), params(result)))
        return by_id, errors
    finally:
        client.stop_stream(cancel_requests=True)


def test_streaming_deltas_end_with_the_finish_reason(kserve_mesh):
    client = triton.InferenceServerClient(kserve_mesh.grpc)
    by_id, errors = stream_all(client, [
        ("s", text_inputs("Tell me a story", True), {"max_tokens": 6, "ignore_eos": True}),
        ("u", text_inputs("Tell me a story", False), {"max_tokens": 6, "ignore_eos": True}),
    ])
    assert not errors
    deltas = by_id["s"]
    assert len(deltas) > 1
    assert all(finish == "" for _, finish, _ in deltas[:-1]) and deltas[-1][1] == "length"
    assert deltas[-1][2]["completion_tokens"] == 6 and "completion_tokens" not in deltas[0][2]
    # streaming=false on a stream: one folded response.
    [(text, finish, usage)] = by_id["u"]
    assert finish == "length" and usage["completion_tokens"] == 6 and text


def test_async_client_infers_and_streams(kserve_mesh):
    async def run():
        client = triton_aio.InferenceServerClient(kserve_mesh.grpc)
        try:
            assert await client.is_model_ready("tiny")
            result = await client.infer("tiny", text_inputs("async hello"), parameters={"max_tokens": 4, "ignore_eos": True})
            assert params(result)["completion_tokens"] == 4

            async def requests_():
                for i in range(3):
                    yield {"model_name": "tiny", "inputs": text_inputs(f"async {i}", True), "request_id": f"a{i}",
                           "parameters": {"max_tokens": 3, "ignore_eos": True}}
            finished = set()
            async for result, error in client.stream_infer(requests_()):
                assert error is None, error
                if result.as_numpy("finish_reason")[0] == b"length":
                    finished.add(result.get_response().id)
                if len(finished) == 3:
                    break
            assert finished == {"a0", "a1", "a2"}
        finally:
            await client.close()
    asyncio.run(run())


def expect_status(code, call):
    with pytest.raises(InferenceServerException) as failure:
        call()
    assert failure.value.status() == f"StatusCode.{code}", failure.value
    return failure.value.message()


def test_errors_have_their_grpc_status(kserve_mesh):
    client = triton.InferenceServerClient(kserve_mesh.grpc)
    # Unknown model: NOT_FOUND, never a parse failure, whatever the inputs are.
    assert "nope" in expect_status("NOT_FOUND", lambda: client.infer("nope", text_inputs("x")))
    bad_name = triton.InferInput("prompt", [1], "BYTES")
    bad_name.set_data_from_numpy(np.array([b"x"], dtype=object))
    assert "nope" in expect_status("NOT_FOUND", lambda: client.infer("nope", [bad_name]))
    expect_status("NOT_FOUND", lambda: client.get_model_metadata("nope"))
    expect_status("NOT_FOUND", lambda: client.get_model_config("nope"))
    assert "prompt" in expect_status("INVALID_ARGUMENT", lambda: client.infer("tiny", [bad_name]))
    wrong_type = triton.InferInput("text_input", [1], "INT32")
    wrong_type.set_data_from_numpy(np.array([3], dtype=np.int32))
    message = expect_status("INVALID_ARGUMENT", lambda: client.infer("tiny", [wrong_type]))
    assert "text_input" in message and "INT32" in message
    assert "Streaming" in expect_status("INVALID_ARGUMENT", lambda: client.infer("tiny", text_inputs("x", True)))
    expect_status("UNIMPLEMENTED", client.get_model_repository_index)
    expect_status("UNIMPLEMENTED", lambda: client.get_inference_statistics("tiny"))


def test_stream_errors_reach_the_client_and_the_stream_goes_on(kserve_mesh):
    arrived = queue.Queue()
    client = triton.InferenceServerClient(kserve_mesh.grpc)
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    try:
        client.async_stream_infer("nope", text_inputs("x", True), request_id="bad")
        client.async_stream_infer("tiny", text_inputs("y", True), request_id="good",
                                  parameters={"max_tokens": 2, "ignore_eos": True})
        seen, error = [], None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (error and seen and seen[-1] == b"length"):
            try:
                result, failure = arrived.get(timeout=0.5)
            except queue.Empty:
                continue
            if failure is not None:
                error = failure
            else:
                seen.append(result.as_numpy("finish_reason")[0])
        assert error is not None and "nope" in str(error) and "not found" in str(error)
        assert seen and seen[-1] == b"length"
    finally:
        client.stop_stream(cancel_requests=True)


def typed_request(model="tiny", text="typed hello", **extra):
    contents = pb.InferTensorContents(bytes_contents=[text.encode()])
    request = pb.ModelInferRequest(model_name=model, id="typed", inputs=[
        pb.ModelInferRequest.InferInputTensor(name="text_input", datatype="BYTES", shape=[1], contents=contents)], **extra)
    request.parameters["max_tokens"].int64_param = 3
    request.parameters["ignore_eos"].bool_param = True
    return request


def test_typed_contents_from_a_raw_grpcio_stub_get_typed_outputs(kserve_mesh):
    # The plain KServe v2 messages through grpcio, as a non-Triton client sends them.
    with grpc.insecure_channel(kserve_mesh.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(typed_request(), timeout=30)
        assert not response.raw_output_contents
        outputs = {o.name: o for o in response.outputs}
        assert outputs["finish_reason"].contents.bytes_contents == [b"length"]
        assert outputs["text_output"].datatype == "BYTES" and outputs["text_output"].contents.bytes_contents[0]
        assert response.parameters["completion_tokens"].int64_param == 3
        # Mixed raw and typed contents is one form too many.
        mixed = typed_request()
        mixed.inputs.add(name="streaming", datatype="BOOL", shape=[1])
        mixed.raw_input_contents.extend([struct.pack("<I", 1) + b"x", b"\x00"])
        with pytest.raises(grpc.RpcError) as failure:
            stub.ModelInfer(mixed, timeout=30)
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "text_input" in failure.value.details()


def test_sixty_four_requests_on_one_stream_all_complete_in_order(up_mesh):
    client = triton.InferenceServerClient(up_mesh.grpc)
    greedy = {"max_tokens": 8, "ignore_eos": True, "temperature": 0.0}
    by_id, errors = stream_all(client, [
        (f"r{i}", text_inputs(f"request number {i}", True), greedy) for i in range(64)])
    assert not errors
    assert sorted(by_id) == sorted(f"r{i}" for i in range(64))
    for request_id, responses in by_id.items():
        finishes = [finish for _, finish, _ in responses]
        assert finishes.count("length") == 1 and finishes[-1] == "length", (request_id, finishes)
        assert responses[-1][2]["completion_tokens"] == 8
    # Each request's deltas arrive in order: joined, they are its unary (greedy) answer.
    for i in (0, 17, 63):
        unary = client.infer("tiny", text_inputs(f"request number {i}"), parameters=greedy)
        assert "".join(text for text, _, _ in by_id[f"r{i}"]) == unary.as_numpy("text_output")[0].decode()


def test_a_stream_runs_at_most_its_concurrency_and_queues_the_rest():
    mesh = start_distributed("etcd", mocker_args=("--decode-speedup-ratio", "0.01"), kserve=True,
                             frontend_args=("--kserve-stream-concurrency", "2"))
    try:
        peak, done = [0], [False]

        def watch():
            while not done[0]:
                peak[0] = max(peak[0], sum(worker_load(a).num_running for a in mesh.worker_rpc))
                time.sleep(0.02)
        watcher = ThreadPoolExecutor(max_workers=1).submit(watch)
        client = triton.InferenceServerClient(mesh.grpc)
        # Six requests of about 0.9 s each written at once: two run, the rest wait their turn.
        by_id, errors = stream_all(client, [
            (f"c{i}", text_inputs(f"queued request {i}", False), {"max_tokens": 150, "ignore_eos": True})
            for i in range(6)], timeout=60)
        done[0] = True
        watcher.result()
        assert not errors and sorted(by_id) == [f"c{i}" for i in range(6)]
        assert all(responses[-1][1] == "length" for responses in by_id.values())
        assert peak[0] == 2, peak[0]
    finally:
        mesh.stop()


def test_a_stream_runs_its_requests_concurrently():
    # A real-time engine: each request takes a real prefill and 32 decode steps (about 200 ms).
    mesh = start_up("up-kserve-realtime", ["--speedup-ratio", "1"])
    try:
        client = triton.InferenceServerClient(mesh.grpc)
        body = {"max_tokens": 32, "ignore_eos": True}
        started = time.monotonic()
        # Folded answers (streaming=false on the stream), so the time measured is the server's
        # and the engine's rather than the Python client's handling of 2 000 deltas.
        by_id, errors = stream_all(client, [("one", text_inputs("a single request", False), body)])
        one = time.monotonic() - started
        assert not errors and by_id["one"][-1][1] == "length"
        started = time.monotonic()
        by_id, errors = stream_all(client, [(f"r{i}", text_inputs(f"request {i}", False), body) for i in range(64)], timeout=60)
        batch = time.monotonic() - started
        assert not errors and len(by_id) == 64 and all(r[-1][1] == "length" for r in by_id.values())
        assert batch < 4 * one, (one, batch)
    finally:
        mesh.stop()


def test_closing_a_stream_cancels_its_running_requests():
    mesh = start_distributed("etcd", mocker_args=("--decode-speedup-ratio", "0.01"), kserve=True)
    try:
        def requests_():
            for i in range(4):
                request = typed_request(text=f"a long answer {i}")
                request.id = f"long{i}"
                request.parameters["max_tokens"].int64_param = 5000
                request.inputs.add(name="streaming", datatype="BOOL", shape=[1],
                                   contents=pb.InferTensorContents(bool_contents=[True]))
                yield request
            time.sleep(60)

        with grpc.insecure_channel(mesh.grpc) as channel:
            call = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(requests_(), timeout=60)
            seen = set()
            for response in call:
                assert not response.error_message, response.error_message
                seen.add(response.infer_response.id)
                if len(seen) == 4:
                    break
            assert sum(worker_load(a).num_running for a in mesh.worker_rpc) == 4
            call.cancel()
        wait_until(lambda: sum(worker_load(a).num_running for a in mesh.worker_rpc) == 0, timeout=10,
                   what="the workers stopped the stream's requests")
        assert metric(mesh, 'dynamo_frontend_inflight_requests{model="tiny"}') == 0
    finally:
        mesh.stop()


def test_usage_and_routing_hints_travel_as_parameters(up_mesh):
    ids = set()
    for _ in range(20):
        r = requests.post(f"{up_mesh.base_url}/v1/completions", timeout=30, json={
            "model": "tiny", "prompt": [1, 2, 3], "max_tokens": 1, "nvext": {"extra_fields": ["worker_id"]}})
        ids.add(r.json()["nvext"]["worker_id"]["decode_worker_id"])
    assert len(ids) == 2
    client = triton.InferenceServerClient(up_mesh.grpc)
    for target in sorted(ids):
        for _ in range(3):
            result = client.infer("tiny", text_inputs("pinned"), parameters={
                "max_tokens": 2, "x-dynamo-worker-instance-id": str(target), "x-dynamo-request-priority": 2})
            assert params(result)["worker_id"] == target
    # A prompt sent twice to one worker: the second finds its blocks cached.
    long_prompt = " ".join(f"cached{i}" for i in range(120))
    pinned = {"max_tokens": 2, "x-dynamo-worker-instance-id": str(min(ids))}
    first = params(client.infer("tiny", text_inputs(long_prompt), parameters=pinned))
    second = params(client.infer("tiny", text_inputs(long_prompt), parameters=pinned))
    assert second["prompt_tokens"] == first["prompt_tokens"]
    assert first["cached_tokens"] < second["cached_tokens"] <= second["prompt_tokens"]
    expect_status("UNAVAILABLE", lambda: client.infer(
        "tiny", text_inputs("x"), parameters={"x-dynamo-worker-instance-id": "12345"}))
    message = expect_status("INVALID_ARGUMENT", lambda: client.infer(
        "tiny", text_inputs("x"), parameters={"x-dynamo-request-priority": "high"}))
    assert "x-dynamo-request-priority" in message


def test_endpoint_labelled_metrics_move(kserve_mesh):
    infer = 'dynamo_frontend_requests_total{model="tiny",endpoint="kserve_infer",status="success"}'
    stream = 'dynamo_frontend_requests_total{model="tiny",endpoint="kserve_stream",request_type="stream",status="success"}'
    failed = 'dynamo_frontend_requests_total{endpoint="kserve_infer",status="error"'
    ttft = 'dynamo_frontend_time_to_first_token_seconds_count{model="tiny"}'
    itl = 'dynamo_frontend_inter_token_latency_seconds_count{model="tiny"}'
    before = {name: metric(kserve_mesh, name) for name in (infer, stream, failed, ttft, itl)}
    client = triton.InferenceServerClient(kserve_mesh.grpc)
    for _ in range(3):
        client.infer("tiny", text_inputs("count me"), parameters={"max_tokens": 3, "ignore_eos": True})
    with pytest.raises(InferenceServerException):
        client.infer("tiny", text_inputs("x", True))
    by_id, _ = stream_all(client, [("m", text_inputs("count me too", True), {"max_tokens": 3, "ignore_eos": True})])
    assert by_id["m"][-1][1] == "length"
    after = {name: metric(kserve_mesh, name) for name in before}
    assert after[infer] - before[infer] == 3
    assert after[stream] - before[stream] == 1
    assert after[failed] - before[failed] == 1
    assert after[ttft] - before[ttft] == 4
    assert after[itl] - before[itl] >= 8


def test_busy_workers_are_resource_exhausted():
    mesh = start_up("up-kserve-busy", ["--speedup-ratio", "0.5", "--active-prefill-tokens-threshold", "100"])
    try:
        rng = random.Random(3)
        prompts = [" ".join(f"w{rng.randrange(10**6)}" for _ in range(600)) for _ in range(12)]
        client = triton.InferenceServerClient(mesh.grpc)

        def one(text):
            try:
                client.infer("tiny", text_inputs(text), parameters={"max_tokens": 2})
                return "OK"
            except InferenceServerException as error:
                return error.status()
        with ThreadPoolExecutor(max_workers=12) as pool:
            outcomes = list(pool.map(one, prompts))
        assert "OK" in outcomes and "StatusCode.RESOURCE_EXHAUSTED" in outcomes, outcomes
        assert set(outcomes) <= {"OK", "StatusCode.RESOURCE_EXHAUSTED"}, outcomes
    finally:
        mesh.stop()


def test_a_model_follows_its_workers_in_model_ready():
    mesh = start_distributed("etcd", num_workers=1, kserve=True)
    try:
        client = triton.InferenceServerClient(mesh.grpc)
        assert client.is_model_ready("tiny") and client.is_server_ready()
        mesh.procs[1].kill()
        wait_until(lambda: not client.is_model_ready("tiny"), timeout=20, what="the model is no longer ready")
        assert not client.is_server_ready()
        # Listed for its grace period without a worker: UNAVAILABLE, not NOT_FOUND.
        expect_status("UNAVAILABLE", lambda: client.infer("tiny", text_inputs("x")))
        # A worker registering again brings the model back.
        env = {"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": os.environ["ETCD_ENDPOINTS"],
               "NATS_SERVER": os.environ["NATS_SERVER"]}
        mesh.procs.append(Proc("mocker-again", list(mesh.procs[1].proc.args), env))
        wait_until(lambda: client.is_model_ready("tiny"), timeout=30, what="the model is ready again")
        assert client.is_server_ready()
        assert params(client.infer("tiny", text_inputs("back"), parameters={"max_tokens": 2}))["completion_tokens"] == 2
    finally:
        mesh.stop()


def server_h2_settings(address):
    """(the server's SETTINGS, its connection window) as an HTTP/2 client first sees them."""
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + struct.pack(">I", 0)[1:] + b"\x04\x00" + b"\x00" * 4)
        conn.settimeout(1.0)
        data = b""
        try:
            while len(data) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            pass
    settings, window = {}, 65535
    while len(data) >= 9:
        length = int.from_bytes(data[:3], "big")
        kind, flags, stream = data[3], data[4], int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
        payload, data = data[9:9 + length], data[9 + length:]
        if kind == 4 and not flags & 1:
            for i in range(0, len(payload), 6):
                key, value = struct.unpack(">HI", payload[i:i + 6])
                settings[key] = value
        elif kind == 8 and stream == 0:
            window += int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
    return settings, window


def test_window_size_variables_reach_the_server(up_mesh, etcd_mesh):
    settings, window = server_h2_settings(up_mesh.grpc)
    assert settings.get(4) == 2097152 and window == 16777216, (settings, window)
    # Unset, the server keeps its defaults.
    settings, window = server_h2_settings(etcd_mesh.grpc)
    assert settings.get(4, 65535) != 2097152 and window != 16777216, (settings, window)


NUMPY_SCRIPT = """
import sys, numpy, tritonclient.grpc as triton
client = triton.InferenceServerClient(sys.argv[1])
prompt = triton.InferInput("text_input", [1], "BYTES")
prompt.set_data_from_numpy(numpy.array([b"numpy check"], dtype=object))
result = client.infer("tiny", [prompt], parameters={"max_tokens": 3, "ignore_eos": True})
text, finish = result.as_numpy("text_output"), result.as_numpy("finish_reason")
print(numpy.__version__.split(".")[0], text.shape[0], finish[0].decode())
"""


@pytest.mark.parametrize("numpy_major", ["1", "2"])
def test_numpy_1_and_2_decode_the_outputs(up_mesh, numpy_major):
    python = os.environ.get("KVMESH_NUMPY1_PYTHON") if numpy_major == "1" else os.sys.executable
    if not python:
        pytest.fail("KVMESH_NUMPY1_PYTHON is not set: scripts/test.sh makes a venv with numpy 1")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(NUMPY_SCRIPT)
    out = subprocess.run([python, script.name, up_mesh.grpc], capture_output=True, text=True, timeout=60)
    Path(script.name).unlink()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [numpy_major, "1", "length"], out.stdout


def test_bench_kserve_loads_both_edges_and_one_stream(up_mesh):
    bench = [str(BIN_DIR / "kvmesh"), "bench", "kserve", "--grpc", up_mesh.grpc]
    http = up_mesh.base_url.removeprefix("http://")
    out = subprocess.run([*bench, "--http", http, "--concurrency", "4", "--duration", "1", "--rounds", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    for side in ("kserve_infer", "completions"):
        assert report[side]["requests"] > 0 and report[side]["failures"] == 0, report
        assert report[side]["client_cpu_ms_per_request"] > 0, report
    assert report["rps_ratio"] > 0 and report["grpc_connections"] == 0
    out = subprocess.run([*bench, "--concurrency", "4", "--grpc-connections", "1", "--duration", "1",
                          "--rounds", "1"], capture_output=True, text=True, timeout=60)
    report = json.loads(out.stdout)
    assert report["grpc_connections"] == 1 and report["kserve_infer"]["failures"] == 0, report
    assert report["kserve_infer"]["requests"] > 0 and "completions" not in report, report
    out = subprocess.run([*bench, "--stream", "--concurrency", "8", "--rounds", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["requests_in_flight"] == 8 and report["one_request_s"] > 0 and report["stream_batch_s"] > 0
