"""`/openapi.json` and `/docs`: the document validates as OpenAPI 3, lists every route the
frontend serves at the path it serves it, and a schema-driven fuzzer (schemathesis, bounded
examples per operation) over every documented operation finds no 500, no crash, no undocumented
status and no error without the documented body."""
import json

import pytest
import jsonschema
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from openapi_spec_validator import validate

from conftest import Mesh, Proc, free_port, wait_until
from test_admission import start_up

EXAMPLES_PER_OPERATION = 25


@pytest.fixture(scope="module")
def mesh():
    mesh = start_up("up-openapi", ["--enable-anthropic-api"])
    yield mesh
    mesh.stop()


def test_document_is_valid_openapi_and_lists_every_route(mesh):
    spec = requests.get(f"{mesh.base_url}/openapi.json", timeout=10).json()
    validate(spec)
    assert spec["openapi"].startswith("3.")
    assert set(spec["paths"]) == {
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
        "/v1/messages", "/v1/messages/count_tokens", "/v1/models", "/health", "/live", "/metrics",
        "/busy_threshold"}
    chat = spec["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ChatCompletionRequest")
    request = spec["components"]["schemas"]["ChatCompletionRequest"]
    assert {"model", "messages"} <= set(request["required"])
    assert "max_completion_tokens" in request["properties"]


def test_docs_serve_swagger_ui_from_the_binary(mesh):
    page = requests.get(f"{mesh.base_url}/docs/", timeout=10)
    assert page.status_code == 200 and "swagger-ui" in page.text.lower()
    bundle = requests.get(f"{mesh.base_url}/docs/swagger-ui-bundle.js", timeout=10)
    assert bundle.status_code == 200 and len(bundle.content) > 100_000


OVERRIDES = {
    "DYN_HTTP_SVC_CHAT_PATH": ("/custom/chat", "post", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    "DYN_HTTP_SVC_CMP_PATH_ENV": ("/custom/completions", "post", {"prompt": "hi", "max_tokens": 2}),
    "DYN_HTTP_SVC_EMB_PATH_ENV": ("/custom/embed", "post", {"input": "hi"}),
    "DYN_HTTP_SVC_RESPONSES_PATH_ENV": ("/custom/responses", "post", {"input": "hi", "max_output_tokens": 2}),
    "DYN_HTTP_SVC_ANTHROPIC_PATH_ENV": ("/custom/messages", "post", {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    "DYN_HTTP_SVC_MODELS_PATH_ENV": ("/custom/models", "get", None),
    "DYN_HTTP_SVC_HEALTH_PATH_ENV": ("/custom/health", "get", None),
    "DYN_HTTP_SVC_LIVE_PATH_ENV": ("/custom/live", "get", None),
    "DYN_HTTP_SVC_METRICS_PATH_ENV": ("/custom/metrics", "get", None),
}
DEFAULTS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
            "/v1/messages", "/v1/models", "/health", "/metrics"]


def test_each_path_override_moves_its_route_and_the_document():
    env = {name: path for name, (path, _, _) in OVERRIDES.items()}
    env["DYN_DISABLE_FRONTEND_ADMIN_API"] = "1"
    port = free_port()
    proc = Proc("up-openapi-paths", ["kvmesh", "up", "--http-host", "127.0.0.1", "--http-port",
                                     str(port), "--tcp-rpc-port", str(free_port()),
                                     "--enable-anthropic-api"], env)
    mesh = Mesh(f"http://127.0.0.1:{port}", [proc])
    try:
        wait_until(lambda: requests.get(f"{mesh.base_url}/custom/health", timeout=2).status_code == 200,
                   what="health at its moved path")
        paths = requests.get(f"{mesh.base_url}/openapi.json", timeout=10).json()["paths"]
        for path, method, body in OVERRIDES.values():
            assert path in paths, path
            url = f"{mesh.base_url}{path}"
            if method == "get":
                moved = requests.get(url, timeout=10)
            else:
                moved = requests.post(url, json={"model": "tiny", **body}, timeout=30)
            assert moved.status_code == 200, (path, moved.text[:300])
        assert "/custom/messages/count_tokens" in paths
        assert requests.post(f"{mesh.base_url}/custom/messages/count_tokens", timeout=10, json={
            "model": "tiny", "messages": [{"role": "user", "content": "hi"}]}).json()["input_tokens"] > 0
        for old in DEFAULTS:
            assert old not in paths, old
            assert requests.request("GET" if old in ("/v1/models", "/health", "/metrics") else "POST",
                                    f"{mesh.base_url}{old}", timeout=10).status_code == 404, old
        assert "/busy_threshold" not in paths
        assert requests.get(f"{mesh.base_url}/busy_threshold", timeout=10).status_code == 404
    finally:
        mesh.stop()


ERROR_STATUSES = {400, 404, 405, 413, 501, 503, 504, 529}
# The document under test, for resolving the schemas its answers refer to.
SPEC = {}


def check_response(case, response):
    status = response.status_code
    where = f"{case.method} {case.path} -> {status}: {response.text[:300]}\nbody: {case.body!r}"[:2000]
    assert status != 500 and status < 600, where
    documented = case.operation.definition.raw["responses"]
    assert str(status) in documented or status == 405, where
    if status in ERROR_STATUSES:
        body = response.json()
        anthropic = "/messages" in case.path
        if anthropic:
            assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"], where
        else:
            assert body["error"]["message"] and body["error"]["type"], where
    elif status == 200 and "application/json" in str(response.headers.get("content-type")):
        # The answer conforms to the schema the document gives for it.
        schema = documented["200"]["content"]["application/json"]["schema"]
        validator = jsonschema.Draft202012Validator({**schema, "components": SPEC["components"]})
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(response.json())]
        assert not errors, f"{where}\n" + "\n".join(errors[:5])


def test_fuzzing_the_documented_routes_finds_no_server_error(mesh):
    spec = requests.get(f"{mesh.base_url}/openapi.json", timeout=10).json()
    SPEC.update(spec)
    schema = schemathesis.openapi.from_dict(spec)
    session = requests.Session()
    tested = 0
    modes = [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in modes:
            @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
                      suppress_health_check=list(HealthCheck), database=None)
            @given(case=operation.as_strategy(generation_mode=mode))
            def fuzz(case):
                response = case.call(base_url=mesh.base_url, session=session, timeout=30)
                check_response(case, response)

            try:
                fuzz()
            except Unsatisfiable:
                # An operation with no inputs has no invalid input to send.
                assert mode == schemathesis.GenerationMode.NEGATIVE
                assert "requestBody" not in operation.definition.raw, operation.path
            tested += 1
    assert tested == len(modes) * len([m for item in spec["paths"].values() for m in item])
    # Still serving after the fuzzing.
    assert requests.get(f"{mesh.base_url}/health", timeout=10).status_code == 200
