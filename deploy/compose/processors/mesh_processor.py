"""The compose mesh's chat processor: a Dynamo-style processor with nothing beyond Python's
standard library, so the processor host's image needs no pip packages. It writes a ChatML prompt,
tokenizes it greedily against the model's byte-level BPE vocabulary (every id it sends is one of
the model's, and equal text gives equal ids, which is what KV routing needs; it is not the
tokenizer's exact merge order), sends the ids through `routed_engine.generate`, and turns the
generated ids back into text. Served as the model `tiny` through `--dyn-chat-processor
mesh_processor:provider`."""
import asyncio
import json
import os
import time
import uuid

from dynamo.llm import PythonAsyncEngine
from dynamo.llm.exceptions import InvalidArgument


def _byte_alphabet():
    """GPT-2's byte-level alphabet: each byte as the printable character the vocabulary uses."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {byte: chr(char) for byte, char in zip(printable, chars)}


class Vocabulary:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "tokenizer.json")) as f:
            tokenizer = json.load(f)
        self.ids = dict(tokenizer["model"]["vocab"])
        self.special = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])}
        self.tokens = {i: t for t, i in self.ids.items()}
        self.tokens.update({i: t for t, i in self.special.items()})
        self.longest = max(len(t) for t in self.ids)
        self.to_char = _byte_alphabet()
        self.to_byte = {c: b for b, c in self.to_char.items()}

    def encode(self, text):
        ids = []
        for piece, is_special in self._split_special(text):
            if is_special:
                ids.append(self.special[piece])
                continue
            mapped = "".join(self.to_char[b] for b in piece.encode())
            at = 0
            while at < len(mapped):
                for end in range(min(len(mapped), at + self.longest), at, -1):
                    if mapped[at:end] in self.ids:
                        ids.append(self.ids[mapped[at:end]])
                        at = end
                        break
                else:
                    at += 1  # a byte the vocabulary lacks: left out
        return ids

    def decode(self, ids):
        text = "".join(self.tokens.get(i, "") for i in ids if i not in self.special.values())
        return bytes(self.to_byte[c] for c in text if c in self.to_byte).decode(errors="replace")

    def _split_special(self, text):
        at = 0
        while at < len(text):
            hits = [(text.find(s, at), s) for s in self.special if text.find(s, at) >= 0]
            if not hits:
                yield text[at:], False
                return
            start, special = min(hits)
            if start > at:
                yield text[at:start], False
            yield special, True
            at = start + len(special)


class MeshChatEngine:
    def __init__(self, routed_engine, mdc):
        self._routed_engine = routed_engine
        self._vocab = Vocabulary(mdc.local_dir())
        self._eos = [self._vocab.special.get("<|im_end|>", 0)]

    async def generate(self, request, context=None):
        messages = request.get("messages")
        if not messages:
            raise InvalidArgument("messages must not be empty")
        prompt = "".join(f"<|im_start|>{m.get('role', 'user')}\n{m.get('content') or ''}<|im_end|>\n"
                         for m in messages) + "<|im_start|>assistant\n"
        token_ids = self._vocab.encode(prompt)
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
        generated, emitted, first = [], "", True
        stream = await self._routed_engine.generate(preprocessed, context=context)
        async for item in stream:
            output = item.data()
            generated.extend(output.get("token_ids", []))
            text = self._vocab.decode(generated)
            delta = {"content": text[len(emitted):]}
            emitted = text
            if first:
                delta["role"] = "assistant"
                first = False
            finish = output.get("finish_reason")
            if finish in ("eos", "stop"):
                finish = "stop"
            yield {"id": chunk_id, "object": "chat.completion.chunk", "created": created,
                   "model": request["model"],
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def provider(config, options):
    async def chat_engine_factory(instance_id, mdc, routed_engine):
        engine = MeshChatEngine(routed_engine, mdc)
        return PythonAsyncEngine(engine.generate, asyncio.get_running_loop())

    return chat_engine_factory
