"""A processor for lifecycle tests. Its factory can fail its first calls (`fail_first` in the
options); its engine answers "whoami" with what it was built with (the factory call, the card's
KV block size) and what its context holds (ids, trace), and otherwise serves like the seed
processor, optionally wrapping each chunk in Dynamo's annotated envelope with token counts that
add `input_bonus` to the prompt's (so a test can tell reported counts from the frontend's own).
A message starting "host" is answered like any other after a first chunk naming the host process
(`[host <pid>]`), so a streaming client knows which of several hosts serves it."""
import asyncio
import json
import os
import time

from dynamo.llm import PythonAsyncEngine

from seed_processor import MyChatEngine

CALLS = {"factory": 0}


def _chunk(request, text, finish=None):
    return {"id": "chatcmpl-lifecycle", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": request["model"],
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": finish}]}


def provider(config, options):
    fail_first = int(options.get("fail_first", 0))
    bonus = options.get("input_bonus")

    async def factory(instance_id, mdc, routed_engine):
        CALLS["factory"] += 1
        if CALLS["factory"] <= fail_first:
            raise RuntimeError(f"factory failure {CALLS['factory']} of {fail_first}")
        built = {"factory_call": CALLS["factory"], "block_size": mdc.kv_cache_block_size(),
                 "namespace": config.namespace}
        seed = MyChatEngine(routed_engine, {}, mdc)

        async def generate(request, context=None):
            if request["messages"][-1]["content"] == "whoami":
                info = {**built, "request_id": context.id(), "trace_id": context.trace_id,
                        "span_id": context.span_id, "parent_span_id": context.parent_span_id}
                yield _chunk(request, json.dumps(info), "stop")
                return
            if request["messages"][-1]["content"].startswith("host"):
                yield _chunk(request, f"[host {os.getpid()}]")
            output_tokens = 0
            async for chunk in seed.generate(request, context):
                if bonus is None:
                    yield chunk
                    continue
                output_tokens += 1
                yield {"_dynamo_annotated": True, "data": chunk, "event": "llm_metrics",
                       "comment": [json.dumps({"input_tokens": 10 + int(bonus), "output_tokens": output_tokens,
                                               "chunk_tokens": 1})]}

        return PythonAsyncEngine(generate, asyncio.get_running_loop())

    return factory
