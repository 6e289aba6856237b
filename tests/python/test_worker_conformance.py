"""The `Worker` contract (proto/kvmesh/v1/worker.proto, llm.proto): what every implementation must
do, run against each implementation the repository has: the Rust mock engine and the Python vLLM
worker. A third implementer runs this file against theirs.

The contract, as these tests hold it:
- registration: an instance record at `/kvmesh/{ns}/instances/{component}/{endpoint}/{id:x}` whose
  address serves the Worker service, and a model record whose card gives the block size, the
  input kind `Tokens` and the runtime config (KV blocks, max sequences, batched tokens);
- `Generate` streams token ids: the first response names the worker, the last has a finish
  reason and usage; `max_tokens`, `ignore_eos`, `stop_token_ids` (with `matched_stop_token_id`),
  `logprobs` and guided decoding (choice, regex) are honoured; a repeated prompt reports its cached prefix in `usage`;
- dropping the stream cancels the request on the engine (its load goes back to zero);
- bad requests are gRPC statuses (INVALID_ARGUMENT), not streams that end in an error;
- `GetLoad` answers one entry per rank under the worker's id and the card's KV capacity, and the
  same load is published on the event plane (`kvmesh.{ns}.load.{model}`) while it changes;
- `ClearKvBlocks` drops the prefix cache: the repeated prompt is no longer cached;
- `Embed` answers unit vectors or UNIMPLEMENTED.
"""
import asyncio
import math
import time

import grpc
import pytest

from conftest import proto_stubs, require_env, wait_until
from etcd_records import instance_records, model_records

pb = proto_stubs()
llm = pb["llm_pb2"]
worker_pb = pb["worker_pb2"]


@pytest.fixture(params=["mocker", "vllm"])
def worker(request):
    if request.param == "mocker":
        return request.getfixturevalue("mocker_worker")
    workers = request.getfixturevalue("vllm_workers")
    live = [w for w in workers if w.proc.alive()]
    assert live, "every vLLM worker exited"
    return live[0]


def stub(worker):
    channel = worker.channel()
    return pb["worker_pb2_grpc"].WorkerStub(channel), channel


def generate(worker, prompt, **fields):
    """All responses of one Generate call."""
    request = llm.GenerateRequest(request_id=f"conf-{time.monotonic_ns()}", model=worker.model, token_ids=prompt)
    stop = fields.pop("stop", None)
    if stop is not None:
        request.stop.CopyFrom(stop)
    sampling = fields.pop("sampling", None)
    if sampling is not None:
        request.sampling.CopyFrom(sampling)
    output = fields.pop("output", None)
    if output is not None:
        request.output.CopyFrom(output)
    routing = fields.pop("routing", None)
    if routing is not None:
        request.routing.CopyFrom(routing)
    assert not fields, fields
    client, channel = stub(worker)
    with channel:
        return list(client.Generate(request, timeout=60))


def tokens(responses):
    return [t for r in responses for t in r.token_ids]


def prompt_of(worker, blocks, seed):
    return [10 + (seed * 31 + i * 7) % 2900 for i in range(blocks * worker.block_size)]


def test_registration_records(worker):
    instances = [r for r in instance_records(worker.namespace) if r["address"] == worker.address]
    assert len(instances) == 1, instances
    record = instances[0]
    assert int(record["instance_id"]) == worker.instance_id
    assert record["transport"] == "grpc"
    assert (record["component"], record["endpoint"]) == ("backend", "generate")
    models = [r for r in model_records(worker.namespace) if int(r["instance_id"]) == worker.instance_id]
    assert len(models) == 1, models
    card = models[0]["card"]
    assert models[0]["model"] == worker.model and card["display_name"] == worker.model
    assert card["kv_cache_block_size"] == worker.block_size
    assert card["model_input"] == "Tokens"
    assert card["model_type"] & 1, card  # Chat
    runtime = card["runtime_config"]
    for name in ("total_kv_blocks", "max_num_seqs", "max_num_batched_tokens"):
        assert int(runtime[name]) > 0, (name, runtime)
    assert len(models[0]["card_checksum"]) == 16


def test_generate_streams_tokens_until_max_tokens(worker):
    prompt = prompt_of(worker, 1, seed=1)
    responses = generate(worker, prompt, stop=llm.StopConditions(max_tokens=7, ignore_eos=True))
    assert responses[0].worker.worker_id == worker.instance_id
    assert len(tokens(responses)) == 7
    last = responses[-1]
    assert last.finish_reason == llm.FINISH_REASON_LENGTH
    assert all(r.finish_reason == llm.FINISH_REASON_UNSPECIFIED for r in responses[:-1])
    assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (len(prompt), 7)


def test_stop_token_ids_end_the_stream(worker):
    prompt = prompt_of(worker, 1, seed=2)
    greedy = llm.SamplingOptions(greedy=True)
    free = tokens(generate(worker, prompt, sampling=greedy, stop=llm.StopConditions(max_tokens=6, ignore_eos=True)))
    target = free[3]
    stopped = generate(worker, prompt, sampling=greedy,
                       stop=llm.StopConditions(max_tokens=6, ignore_eos=True, stop_token_ids=[target]))
    out = tokens(stopped)
    last = stopped[-1]
    assert last.finish_reason == llm.FINISH_REASON_STOP, last
    assert last.matched_stop_token_id == target
    # The stream ends at the first occurrence of the stop token, which it includes.
    assert out == free[:free.index(target) + 1], (out, free)


def test_greedy_output_is_reproducible(worker):
    prompt = prompt_of(worker, 1, seed=3)
    args = dict(sampling=llm.SamplingOptions(greedy=True), stop=llm.StopConditions(max_tokens=5, ignore_eos=True))
    assert tokens(generate(worker, prompt, **args)) == tokens(generate(worker, prompt, **args))


def test_logprobs_are_returned_per_token(worker):
    responses = generate(worker, prompt_of(worker, 1, seed=4), output=llm.OutputOptions(logprobs=2),
                         stop=llm.StopConditions(max_tokens=4, ignore_eos=True))
    entries = [e for r in responses for e in r.logprobs]
    assert [e.token_id for e in entries] == tokens(responses)
    for entry in entries:
        assert entry.logprob <= 0.0
        assert 1 <= len(entry.top) <= 3, entry
        assert all(t.logprob <= 0.0 for t in entry.top)


def test_guided_choice_and_regex_constrain_the_output(worker):
    from tokenizers import Tokenizer

    from conftest import TINY_MODEL
    tokenizer = Tokenizer.from_file(str(TINY_MODEL / "tokenizer.json"))
    stop = llm.StopConditions(max_tokens=24)
    choices = ["alpha beta", "gamma"]
    out = tokens(generate(worker, prompt_of(worker, 1, seed=9), stop=stop,
                          sampling=llm.SamplingOptions(guided_choice=choices)))
    assert tokenizer.decode(out, skip_special_tokens=True) in choices, out
    out = tokens(generate(worker, prompt_of(worker, 1, seed=10), stop=stop,
                          sampling=llm.SamplingOptions(guided_regex="[0-9]{3}")))
    text = tokenizer.decode(out, skip_special_tokens=True)
    assert len(text) == 3 and text.isdigit(), (text, out)


def test_repeated_prompt_reports_its_cached_prefix(worker):
    prompt = prompt_of(worker, 3, seed=5)
    stop = llm.StopConditions(max_tokens=2, ignore_eos=True)
    generate(worker, prompt, stop=stop)
    second = generate(worker, prompt, stop=stop)[-1].usage
    assert second.cached_tokens >= 2 * worker.block_size, second


def test_bad_requests_are_invalid_argument_statuses(worker):
    cases = {
        "empty prompt": dict(prompt=[]),
        "dp rank out of range": dict(prompt=[5, 6, 7], routing=llm.RoutingHints(dp_rank=9)),
        "two guided modes": dict(prompt=[5, 6, 7], sampling=llm.SamplingOptions(guided_regex="a+", guided_choice=["x"])),
    }
    for name, case in cases.items():
        prompt = case.pop("prompt")
        with pytest.raises(grpc.RpcError) as caught:
            generate(worker, prompt, **case)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, caught.value)


def load_of(worker):
    client, channel = stub(worker)
    with channel:
        return client.GetLoad(worker_pb.GetLoadRequest(), timeout=10)


def test_get_load_names_the_worker_and_its_capacity(worker):
    ranks = load_of(worker).ranks
    assert len(ranks) == 1
    card = [r for r in model_records(worker.namespace) if int(r["instance_id"]) == worker.instance_id][0]["card"]
    assert ranks[0].worker_id == worker.instance_id
    assert ranks[0].kv_total_blocks == int(card["runtime_config"]["total_kv_blocks"])


class LoadWatch:
    """Every WorkerLoad one worker publishes on the event plane, collected on a thread."""

    def __init__(self, worker):
        import threading
        self.worker = worker
        self.seen = []
        self._stop = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "no NATS subscription"

    async def _run(self):
        import nats
        client = await nats.connect(require_env("NATS_SERVER"))
        events = pb["events_pb2"]

        async def on_message(message):
            load = events.WorkerLoad.FromString(message.data)
            if load.worker_id == self.worker.instance_id:
                self.seen.append(load)

        await client.subscribe(f"kvmesh.{self.worker.namespace}.load.{self.worker.model}", cb=on_message)
        await client.flush()
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()
        await client.close()

    def close(self):
        self._stop._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def test_dropping_the_stream_cancels_the_request_and_load_is_published(worker):
    watch = LoadWatch(worker)
    client, channel = stub(worker)
    request = llm.GenerateRequest(request_id=f"cancel-{time.monotonic_ns()}", model=worker.model,
                                  token_ids=prompt_of(worker, 1, seed=6))
    request.stop.max_tokens = 1000
    request.stop.ignore_eos = True
    call = client.Generate(request, timeout=120)
    try:
        first = next(call)
        assert first.token_ids
        # While the stream is open the request runs: GetLoad and the published load say so.
        assert load_of(worker).ranks[0].num_running >= 1
        wait_until(lambda: any(load.num_running >= 1 for load in watch.seen), timeout=10,
                   what="a published load with the request running")
        call.cancel()
        wait_until(lambda: load_of(worker).ranks[0].num_running == 0, timeout=10,
                   what="the cancelled request to leave the engine")
        wait_until(lambda: watch.seen[-1].num_running == 0, timeout=10, what="the published load back to zero")
    finally:
        call.cancel()
        channel.close()
        watch.close()


def test_clear_kv_blocks_drops_the_prefix_cache(worker):
    prompt = prompt_of(worker, 3, seed=8)
    stop = llm.StopConditions(max_tokens=2, ignore_eos=True)
    generate(worker, prompt, stop=stop)
    client, channel = stub(worker)
    with channel:
        cleared = client.ClearKvBlocks(worker_pb.ClearKvBlocksRequest(), timeout=10)
    assert cleared.num_blocks_cleared >= 3
    assert generate(worker, prompt, stop=stop)[-1].usage.cached_tokens == 0


def test_embed_answers_unit_vectors_or_unimplemented(worker):
    client, channel = stub(worker)
    request = worker_pb.EmbedRequest(request_id="embed", model=worker.model,
                                     inputs=[worker_pb.EmbedInput(token_ids=[5, 6, 7])])
    with channel:
        try:
            answer = client.Embed(request, timeout=10)
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.UNIMPLEMENTED, error
            return
    assert len(answer.embeddings) == 1
    assert math.isclose(math.sqrt(sum(v * v for v in answer.embeddings[0].values)), 1.0, rel_tol=1e-4)
