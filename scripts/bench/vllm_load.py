"""Closed-loop streaming chat load against an OpenAI-compatible server, for scripts/bench/vllm.sh.

Keeps CONCURRENCY streams open for the duration, each sending the next request when its previous
one ends; prompts are PROMPT_WORDS words drawn per request (no shared prefix). Prints one JSON line:
requests/s, output tokens/s and TTFT (time to the first content chunk) mean/p50/p90/p99 in ms,
and the count of failed requests.

usage: python vllm_load.py BASE_URL MODEL [--concurrency 4] [--duration 30] [--warmup 5]
       [--max-tokens 32] [--prompt-words 100]
"""
import argparse
import asyncio
import json
import random
import statistics
import time

import openai

WORDS = ("the of and to in is was for on that with by as at from his her they this are be which "
         "or an had not but what all were when we there can more if no out so said up one about").split()


async def stream_once(client, model, rng, args, stats, measuring):
    prompt = " ".join(rng.choice(WORDS) for _ in range(args.prompt_words))
    started = time.perf_counter()
    first = None
    tokens = 0
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and first is None:
                first = time.perf_counter()
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
    except openai.APIError:
        if measuring():
            stats["errors"] += 1
        return
    if measuring() and first is not None:
        stats["ttft"].append((first - started) * 1000)
        stats["requests"] += 1
        stats["tokens"] += tokens


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_url")
    ap.add_argument("model")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=100)
    args = ap.parse_args()
    client = openai.AsyncOpenAI(base_url=args.base_url, api_key="unused", max_retries=0, timeout=120)
    stats = {"ttft": [], "requests": 0, "tokens": 0, "errors": 0}
    begin = time.perf_counter()
    measure_from, measure_to = begin + args.warmup, begin + args.warmup + args.duration

    def measuring():
        return measure_from <= time.perf_counter() <= measure_to

    async def loop(seed):
        rng = random.Random(seed)
        while time.perf_counter() < measure_to:
            await stream_once(client, args.model, rng, args, stats, measuring)

    await asyncio.gather(*(loop(i) for i in range(args.concurrency)))
    ttft = sorted(stats["ttft"]) or [float("nan")]
    pick = lambda q: ttft[min(len(ttft) - 1, int(q * len(ttft)))]
    print(json.dumps({
        "concurrency": args.concurrency, "requests": stats["requests"], "errors": stats["errors"],
        "req_per_s": round(stats["requests"] / args.duration, 2),
        "output_tok_per_s": round(stats["tokens"] / args.duration, 1),
        "ttft_ms": {"mean": round(statistics.fmean(ttft), 1), "p50": round(pick(0.5), 1),
                    "p90": round(pick(0.9), 1), "p99": round(pick(0.99), 1)},
    }))


if __name__ == "__main__":
    asyncio.run(main())
