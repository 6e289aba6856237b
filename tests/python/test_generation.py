"""Generation features through the official openai SDK against `kvmesh up` and its mock engine:
readable, re-tokenizable output; greedy and seeded determinism whatever the request id; log
probabilities in the chat and completions shapes."""
import re

import pytest

PROMPT = [{"role": "user", "content": "Tell me about the weather in the river town."}]


def chat(mesh, **kwargs):
    args = dict(model="tiny", messages=PROMPT, max_tokens=16)
    args.update(kwargs)
    return mesh.client().chat.completions.create(**args)


def streamed_text(stream):
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_output_is_words_that_retokenize_to_the_same_count(kvmesh_up):
    resp = chat(kvmesh_up, max_tokens=24, temperature=0)
    text = resp.choices[0].message.content
    assert re.fullmatch(r"( [a-z]+)+", text), text
    # The text, sent back as a prompt, is exactly as many tokens as the engine generated.
    again = kvmesh_up.client().completions.create(model="tiny", prompt=text, max_tokens=1)
    assert again.usage.prompt_tokens == resp.usage.completion_tokens == 24


def test_greedy_stream_equals_greedy_unary_whatever_the_request_id(kvmesh_up):
    unary = chat(kvmesh_up, temperature=0, extra_headers={"x-request-id": "greedy-a"})
    stream = chat(kvmesh_up, temperature=0, stream=True, extra_headers={"x-request-id": "greedy-b"})
    assert streamed_text(stream) == unary.choices[0].message.content
    other_prompt = chat(kvmesh_up, temperature=0, messages=[{"role": "user", "content": "Something else."}])
    assert other_prompt.choices[0].message.content != unary.choices[0].message.content


def test_a_seed_fixes_a_sampled_output(kvmesh_up):
    def sample(seed, request_id):
        return chat(kvmesh_up, temperature=1.0, seed=seed,
                    extra_headers={"x-request-id": request_id}).choices[0].message.content
    assert sample(7, "seeded-a") == sample(7, "seeded-b")
    assert sample(7, "seeded-c") != sample(8, "seeded-d")
    unseeded = {chat(kvmesh_up, temperature=1.0).choices[0].message.content for _ in range(2)}
    assert len(unseeded) == 2


def test_chat_logprobs_one_entry_per_token_with_its_alternatives(kvmesh_up):
    resp = chat(kvmesh_up, temperature=0, logprobs=True, top_logprobs=3)
    choice = resp.choices[0]
    content = choice.logprobs.content
    assert len(content) == resp.usage.completion_tokens == 16
    assert "".join(bytes(e.bytes).decode() for e in content) == choice.message.content
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 3
        # Greedy: the emitted token is the most likely one.
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == entry.logprob
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
    # The same request without logprobs produces the same tokens.
    assert chat(kvmesh_up, temperature=0).choices[0].message.content == choice.message.content


def test_streamed_chat_logprobs_cover_every_token(kvmesh_up):
    stream = chat(kvmesh_up, temperature=0, logprobs=True, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert len(entries) == chunks[-1].usage.completion_tokens == 16
    assert all(e.top_logprobs == [] and e.logprob <= 0 for e in entries)
    assert "".join(e.token for e in entries) == streamed_text(chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_are_parallel_arrays(kvmesh_up, stream):
    args = dict(model="tiny", prompt="The cache", max_tokens=10, logprobs=2, temperature=0)
    if stream:
        chunks = [c for c in kvmesh_up.client().completions.create(stream=True, **args) if c.choices]
        text = "".join(c.choices[0].text for c in chunks)
        parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
        tokens = [t for p in parts for t in p.tokens]
        token_logprobs = [t for p in parts for t in p.token_logprobs]
        top = [t for p in parts for t in p.top_logprobs]
        offsets = [t for p in parts for t in p.text_offset]
    else:
        resp = kvmesh_up.client().completions.create(**args)
        text = resp.choices[0].text
        lp = resp.choices[0].logprobs
        tokens, token_logprobs, top, offsets = lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset
    assert len(tokens) == len(token_logprobs) == len(top) == len(offsets) == 10
    assert "".join(tokens) == text
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(10)]
    assert all(lp <= 0 for lp in token_logprobs)
    assert all(len(alternatives) == 2 and max(alternatives.values()) == lp
               for alternatives, lp in zip(top, token_logprobs))


def test_tokens_can_be_named_by_id(kvmesh_up):
    resp = chat(kvmesh_up, logprobs=True, top_logprobs=1,
                extra_body={"return_tokens_as_token_ids": True})
    for entry in resp.choices[0].logprobs.content:
        assert re.fullmatch(r"token_id:\d+", entry.token)
        assert re.fullmatch(r"token_id:\d+", entry.top_logprobs[0].token)
    completion = kvmesh_up.client().completions.create(
        model="tiny", prompt="The cache", max_tokens=4, logprobs=0,
        extra_body={"return_tokens_as_token_ids": True})
    assert all(re.fullmatch(r"token_id:\d+", t) for t in completion.choices[0].logprobs.tokens)


def test_n_choices_with_ignore_eos_sum_their_usage(kvmesh_up):
    resp = chat(kvmesh_up, n=2, max_tokens=9, temperature=1.0, seed=3, extra_body={"ignore_eos": True})
    assert [c.index for c in resp.choices] == [0, 1]
    assert all(c.finish_reason == "length" for c in resp.choices)
    texts = [c.message.content for c in resp.choices]
    assert texts[0] != texts[1]
    # Choice 0 is the request itself: the same as asking for one choice with that seed.
    assert chat(kvmesh_up, max_tokens=9, temperature=1.0, seed=3).choices[0].message.content == texts[0]
    assert resp.usage.completion_tokens == 18
    one = chat(kvmesh_up, max_tokens=9, temperature=1.0, seed=3)
    assert resp.usage.prompt_tokens == one.usage.prompt_tokens
    greedy = chat(kvmesh_up, n=3, max_tokens=6, temperature=0)
    assert len({c.message.content for c in greedy.choices}) == 1


def test_n_choices_stream_interleaved_by_index(kvmesh_up):
    stream = chat(kvmesh_up, n=2, max_tokens=8, temperature=1.0, seed=5, stream=True, logprobs=True,
                  stream_options={"include_usage": True})
    chunks = list(stream)
    texts, finishes, entries = {0: "", 1: ""}, {}, {0: 0, 1: 0}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.logprobs:
                entries[choice.index] += len(choice.logprobs.content)
            if choice.finish_reason:
                finishes[choice.index] = choice.finish_reason
    assert finishes == {0: "length", 1: "length"}
    assert entries == {0: 8, 1: 8}
    assert chunks[-1].usage.completion_tokens == 16
    unary = chat(kvmesh_up, n=2, max_tokens=8, temperature=1.0, seed=5)
    assert [texts[0], texts[1]] == [c.message.content for c in unary.choices]


def test_n_completions_unary_and_streamed(kvmesh_up):
    args = dict(model="tiny", prompt="The cache", max_tokens=5, n=2, temperature=1.0, seed=11)
    unary = kvmesh_up.client().completions.create(**args)
    assert [c.index for c in unary.choices] == [0, 1] and unary.usage.completion_tokens == 10
    texts = {0: "", 1: ""}
    for chunk in kvmesh_up.client().completions.create(stream=True, **args):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert [texts[0], texts[1]] == [c.text for c in unary.choices]
