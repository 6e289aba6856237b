"""A chat processor written exactly as Dynamo's documentation shows one: it imports `dynamo.llm`,
renders the model's chat template and tokenizes with the model's `tokenizer.json` (from
`mdc.local_dir()`), sends the tokens through `routed_engine.generate`, and builds OpenAI chunks
from the detokenized output. kvmesh's processor host must run it unchanged."""
import asyncio
import json
import os
import time
import uuid

import jinja2
from tokenizers import Tokenizer

from dynamo.llm import PythonAsyncEngine
from dynamo.llm.exceptions import InvalidArgument


class MyChatEngine:
    def __init__(self, routed_engine, options, mdc):
        self._routed_engine = routed_engine
        self._options = options
        local = mdc.local_dir()
        self._tokenizer = Tokenizer.from_file(os.path.join(local, "tokenizer.json"))
        with open(os.path.join(local, "tokenizer_config.json")) as f:
            config = json.load(f)
        self._template = jinja2.Environment().from_string(config["chat_template"])
        self._eos = [self._tokenizer.token_to_id(config["eos_token"])]
        self._runtime = mdc.runtime_config()

    async def generate(self, request, context=None):
        messages = request.get("messages")
        if not messages:
            raise InvalidArgument("messages must not be empty")
        prompt = self._template.render(messages=messages, add_generation_prompt=True)
        token_ids = self._tokenizer.encode(prompt, add_special_tokens=False).ids
        preprocessed = {
            "model": request["model"],
            "token_ids": token_ids,
            "stop_conditions": {"max_tokens": request.get("max_tokens") or 16,
                                "stop_token_ids_hidden": [], "ignore_eos": False},
            "sampling_options": {"temperature": request.get("temperature"), "seed": request.get("seed")},
            "output_options": {"skip_special_tokens": True},
            "eos_token_ids": self._eos,
            "annotations": [],
            "routing": (request.get("nvext") or {}).get("routing"),
        }
        chunk_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        generated = []
        emitted = ""
        stream = await self._routed_engine.generate(preprocessed, context=context)
        first = True
        async for item in stream:
            output = item.data()
            generated.extend(output.get("token_ids", []))
            text = self._tokenizer.decode(generated)
            delta = {"content": text[len(emitted):]}
            emitted = text
            if first:
                delta["role"] = "assistant"
                first = False
            finish = output.get("finish_reason")
            if finish in ("eos", "stop"):
                finish = "stop"
            chunk = {"id": chunk_id, "object": "chat.completion.chunk", "created": created,
                     "model": request["model"],
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if self._options.get("annotate"):
                yield {"_dynamo_annotated": True, "data": chunk, "event": "llm_metrics",
                       "comment": [json.dumps({"input_tokens": len(token_ids), "output_tokens": len(generated),
                                               "chunk_tokens": len(output.get("token_ids", []))})]}
            else:
                yield chunk


def provider(config, options):
    async def chat_engine_factory(instance_id, mdc, routed_engine):
        engine = MyChatEngine(routed_engine, options, mdc)
        return PythonAsyncEngine(engine.generate, asyncio.get_running_loop())

    return chat_engine_factory
