"""Prompt caching on the Anthropic Messages API (official `anthropic` SDK) against `kvmesh up
--router-mode kv --enable-anthropic-api`: a repeated prompt reports `cache_read_input_tokens`,
and Claude Code's per-request billing line (`x-anthropic-billing-header: ...`) leaves the system
prompt (`--strip-anthropic-preamble`, on by default) so that it neither counts nor breaks the
cache; with `--no-strip-anthropic-preamble` or `DYN_STRIP_ANTHROPIC_PREAMBLE=false` it stays."""
import time

import anthropic
import pytest

from test_admission import start_up

SYSTEM = "You are a coding agent working in a large repository. Be brief and precise."
KV_ARGS = ["--enable-anthropic-api", "--router-mode", "kv", "--speedup-ratio", "100"]


def billing(n):
    return f"x-anthropic-billing-header: cc_version=2.1.{n}.a{n}f; cc_entrypoint=cli; cch={n:05x};"


def long_question(tag):
    # Several KV blocks (64 tokens each) of prompt, so a repeat can be served from the cache.
    facts = " ".join(f"Fact {i} about the {tag} cache is that entry {i} stays warm." for i in range(60))
    return [{"role": "user", "content": f"{facts} Summarize the {tag} cache."}]


@pytest.fixture(scope="module")
def kv_mesh():
    mesh = start_up("up-anthropic-kv", KV_ARGS)
    yield mesh
    mesh.stop()


@pytest.fixture(scope="module", params=["flag", "env"])
def keeping_mesh(request):
    if request.param == "flag":
        mesh = start_up("up-anthropic-keep", [*KV_ARGS, "--no-strip-anthropic-preamble"])
    else:
        mesh = start_up("up-anthropic-keep-env", KV_ARGS, {"DYN_STRIP_ANTHROPIC_PREAMBLE": "false"})
    yield mesh
    mesh.stop()


def claude(mesh):
    return anthropic.Anthropic(base_url=mesh.base_url, api_key="unused", max_retries=0)


def with_billing(n, as_blocks):
    if as_blocks:
        return [{"type": "text", "text": billing(n)}, {"type": "text", "text": SYSTEM}]
    return f"{billing(n)}\n{SYSTEM}"


def counts(mesh, system):
    client = claude(mesh)
    question = [{"role": "user", "content": "What changed?"}]
    counted = client.messages.count_tokens(model="tiny", system=system, messages=question).input_tokens
    used = client.messages.create(model="tiny", max_tokens=2, system=system, messages=question).usage.input_tokens
    return counted, used


def cache_reads(mesh, system, question, repeats=2):
    """`cache_read_input_tokens` of each of `repeats` identical requests, a pause apart so that
    the first one's blocks reach the router's index."""
    reads = []
    for _ in range(repeats):
        message = claude(mesh).messages.create(model="tiny", max_tokens=4, system=system, messages=question)
        reads.append(message.usage.cache_read_input_tokens)
        time.sleep(0.5)
    return reads


def test_a_repeated_prompt_reads_from_the_cache(kv_mesh):
    first, second = cache_reads(kv_mesh, SYSTEM, long_question("repeat"))
    assert first == 0
    assert second > 0, second


@pytest.mark.parametrize("as_blocks", [True, False], ids=["blocks", "string"])
def test_the_billing_line_is_stripped_before_counting(kv_mesh, as_blocks):
    without = counts(kv_mesh, SYSTEM)
    assert without[0] == without[1]
    assert counts(kv_mesh, with_billing(1, as_blocks)) == without
    assert counts(kv_mesh, with_billing(2, as_blocks)) == without
    # A system prompt of nothing but the billing line is no system prompt.
    assert counts(kv_mesh, [{"type": "text", "text": billing(3)}]) == counts(kv_mesh, "")


def test_billing_lines_that_differ_do_not_break_the_cache(kv_mesh):
    question = long_question("billing")
    client = claude(kv_mesh)
    first = client.messages.create(model="tiny", max_tokens=4, system=with_billing(10, True), messages=question)
    time.sleep(0.5)
    second = client.messages.create(model="tiny", max_tokens=4, system=with_billing(11, True), messages=question)
    assert first.usage.input_tokens == second.usage.input_tokens
    assert second.usage.cache_read_input_tokens > 0


def test_without_stripping_the_billing_line_counts(keeping_mesh):
    without = counts(keeping_mesh, SYSTEM)
    for as_blocks in (True, False):
        kept = counts(keeping_mesh, with_billing(1, as_blocks))
        assert kept[0] == kept[1] > without[0], (as_blocks, kept, without)
    # And, the prompt changing at its start, a request differing only in that line reads nothing.
    question = long_question("kept")
    client = claude(keeping_mesh)
    client.messages.create(model="tiny", max_tokens=4, system=with_billing(20, True), messages=question)
    time.sleep(0.5)
    second = client.messages.create(model="tiny", max_tokens=4, system=with_billing(21, True), messages=question)
    assert second.usage.cache_read_input_tokens == 0
