"""Structured output through the official openai SDK against `kvmesh up`: `response_format`
(`json_object`, `json_schema`) and the `nvext` guided fields (`guided_regex`, `guided_choice`)
travel to the mock engine as guided decoding, which writes output that satisfies them."""
import json
import re

import jsonschema
import openai
import pytest

PROMPT = [{"role": "user", "content": "Describe a worker as JSON."}]

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2},
        "rank": {"type": "integer", "minimum": 1, "maximum": 8},
        "load": {"type": "number", "minimum": 0, "maximum": 1},
        "healthy": {"type": "boolean"},
        "role": {"enum": ["prefill", "decode"]},
        "blocks": {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {"host": {"type": "string"}, "port": {"type": "integer", "minimum": 1024, "maximum": 65535}},
            "required": ["host", "port"],
        },
    },
    "required": ["name", "rank", "load", "healthy", "role", "blocks", "address"],
}

JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "worker", "schema": SCHEMA, "strict": True}}


def chat(mesh, **kwargs):
    args = dict(model="tiny", messages=PROMPT, max_tokens=200)
    args.update(kwargs)
    return mesh.client().chat.completions.create(**args)


def test_json_schema_output_validates_unary_and_streamed(kvmesh_up):
    resp = chat(kvmesh_up, response_format=JSON_SCHEMA_FORMAT, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason == "stop"
    value = json.loads(choice.message.content)
    jsonschema.validate(value, SCHEMA)
    # The output is what the engine generated: its token count is the completion's.
    again = kvmesh_up.client().completions.create(model="tiny", prompt=choice.message.content, max_tokens=1)
    assert again.usage.prompt_tokens == resp.usage.completion_tokens
    stream = chat(kvmesh_up, response_format=JSON_SCHEMA_FORMAT, temperature=0, stream=True)
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == choice.message.content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_sampled_json_varies_and_still_validates(kvmesh_up):
    outputs = [chat(kvmesh_up, response_format=JSON_SCHEMA_FORMAT, temperature=1.0, seed=s).choices[0].message.content
               for s in range(4)]
    for text in outputs:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert len(set(outputs)) > 1


def test_json_object_output_is_an_object(kvmesh_up):
    resp = chat(kvmesh_up, response_format={"type": "json_object"})
    assert isinstance(json.loads(resp.choices[0].message.content), dict)


def test_completions_take_response_format(kvmesh_up):
    resp = kvmesh_up.client().completions.create(
        model="tiny", prompt="A worker:", max_tokens=200, extra_body={"response_format": JSON_SCHEMA_FORMAT})
    jsonschema.validate(json.loads(resp.choices[0].text), SCHEMA)


@pytest.mark.parametrize("pattern", [r"\d{3}-\d{4}", r"(cache|router) hit [0-9]{1,3}%", r"[A-Z][a-z]+@[a-z]+\.com"])
def test_guided_regex_output_matches_in_full(kvmesh_up, pattern):
    for seed in range(3):
        resp = chat(kvmesh_up, seed=seed, temperature=1.0, extra_body={"nvext": {"guided_regex": pattern}})
        assert re.fullmatch(pattern, resp.choices[0].message.content), resp.choices[0].message.content
        assert resp.choices[0].finish_reason == "stop"


def test_guided_choice_output_is_one_of_them(kvmesh_up):
    choices = ["positive", "negative", "neutral"]
    seen = set()
    for seed in range(8):
        resp = chat(kvmesh_up, seed=seed, temperature=1.0, extra_body={"nvext": {"guided_choice": choices}})
        assert resp.choices[0].message.content in choices
        seen.add(resp.choices[0].message.content)
    assert len(seen) > 1


def test_max_tokens_cuts_guided_output_with_length(kvmesh_up):
    resp = chat(kvmesh_up, response_format=JSON_SCHEMA_FORMAT, max_tokens=3)
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 3


def test_bad_or_conflicting_constraints_are_refused(kvmesh_up):
    client = kvmesh_up.client()
    with pytest.raises(openai.BadRequestError) as err:
        chat(kvmesh_up, response_format={"type": "json_object"}, extra_body={"nvext": {"guided_regex": "a+"}})
    assert err.value.body["param"] == "nvext.guided_regex"
    with pytest.raises(openai.BadRequestError) as err:
        chat(kvmesh_up, extra_body={"nvext": {"guided_regex": "(unclosed"}})
    assert "regular expression" in err.value.body["message"]
    with pytest.raises(openai.BadRequestError) as err:
        chat(kvmesh_up, extra_body={"nvext": {"guided_choice": []}})
    assert err.value.body["param"] == "nvext.guided_choice"
    with pytest.raises(openai.BadRequestError):
        chat(kvmesh_up, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}})
    with pytest.raises(openai.APIStatusError) as err:
        chat(kvmesh_up, extra_body={"nvext": {"guided_grammar": "root ::= \"a\""}})
    assert err.value.status_code == 501
    # The mesh still serves.
    assert client.chat.completions.create(model="tiny", messages=PROMPT, max_tokens=2).choices[0].message.content


def test_responses_text_format_constrains_the_output(kvmesh_up):
    resp = kvmesh_up.client().responses.create(
        model="tiny", input="Describe a worker.", max_output_tokens=200,
        text={"format": {"type": "json_schema", "name": "worker", "schema": SCHEMA, "strict": True}})
    assert resp.status == "completed"
    jsonschema.validate(json.loads(resp.output_text), SCHEMA)


def test_logit_bias_is_refused_not_ignored(kvmesh_up):
    with pytest.raises(openai.APIStatusError) as err:
        chat(kvmesh_up, logit_bias={"42": 5})
    assert err.value.status_code == 501 and "logit_bias" in err.value.body["message"]
    # An empty map asks for nothing.
    assert chat(kvmesh_up, logit_bias={}, max_tokens=2).choices[0].message.content


def test_prompt_logprobs_are_refused_not_left_out(kvmesh_up):
    with pytest.raises(openai.APIStatusError) as err:
        kvmesh_up.client().completions.create(model="tiny", prompt="The cache", max_tokens=2, echo=True, logprobs=1)
    assert err.value.status_code == 501 and "echo" in err.value.body["message"]


def test_root_guided_fields_constrain_chat_and_completions_and_win_over_nvext(kvmesh_up):
    """vLLM and Dynamo clients send guided_* at the root; the nvext spellings are the deprecated ones."""
    pattern = r"\d{3}-\d{4}"
    resp = chat(kvmesh_up, extra_body={"guided_regex": pattern, "guided_decoding_backend": "xgrammar"})
    assert re.fullmatch(pattern, resp.choices[0].message.content), resp.choices[0].message.content
    choices = ["alpha", "beta"]
    resp = chat(kvmesh_up, extra_body={"guided_choice": choices, "nvext": {"guided_choice": ["gamma"]}})
    assert resp.choices[0].message.content in choices
    resp = chat(kvmesh_up, extra_body={"guided_json": SCHEMA})
    jsonschema.validate(json.loads(resp.choices[0].message.content), SCHEMA)
    text = kvmesh_up.client().completions.create(
        model="tiny", prompt="A worker:", max_tokens=200, extra_body={"guided_json": json.dumps(SCHEMA)}).choices[0].text
    jsonschema.validate(json.loads(text), SCHEMA)
    text = kvmesh_up.client().completions.create(
        model="tiny", prompt="Pick:", max_tokens=20, extra_body={"guided_choice": choices}).choices[0].text
    assert text in choices
    with pytest.raises(openai.BadRequestError) as err:
        chat(kvmesh_up, extra_body={"guided_regex": "(unclosed"})
    assert err.value.body["param"] == "guided_regex"
    with pytest.raises(openai.APIStatusError) as err:
        chat(kvmesh_up, extra_body={"guided_grammar": "root ::= \"a\""})
    assert err.value.status_code == 501 and "'guided_grammar'" in err.value.body["message"]


def test_sampled_n2_json_differs_between_choices_and_greedy_n2_does_not(kvmesh_up):
    sampled = chat(kvmesh_up, n=2, temperature=1.0, response_format=JSON_SCHEMA_FORMAT)
    texts = [choice.message.content for choice in sampled.choices]
    for text in texts:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert texts[0] != texts[1]
    greedy = [chat(kvmesh_up, n=2, temperature=0, response_format=JSON_SCHEMA_FORMAT) for _ in range(2)]
    greedy_texts = {choice.message.content for resp in greedy for choice in resp.choices}
    assert len(greedy_texts) == 1
    jsonschema.validate(json.loads(greedy_texts.pop()), SCHEMA)
