"""A worker that dies mid-stream (no migration allowed) ends each streaming protocol with its own
error shape after the events already sent: Anthropic Messages with `event: error` carrying the
Anthropic error body, Responses with `response.failed` carrying the response and its error, and
a Responses stream that runs to the end with `response.completed`. Real frontend and mock
worker processes over real etcd and NATS."""
import json
import threading

import requests

from conftest import start_distributed


def sse_events(response):
    """(event name, data) pairs of a server-sent event stream, as they arrive."""
    name = None
    for line in response.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, json.loads(line[6:])
            name = None


def stream_until_the_worker_dies(mesh, path, body, headers=None):
    """Streams `body`, SIGKILLs the only worker once two events arrived, and returns every event
    the client got."""
    worker = mesh.procs[1]
    events = []
    with requests.post(f"{mesh.base_url}{path}", json=body, headers=headers or {}, stream=True,
                       timeout=60) as r:
        assert r.status_code == 200, r.text
        killer = None
        for event in sse_events(r):
            events.append(event)
            if len(events) == 2:
                killer = threading.Thread(target=worker.kill)
                killer.start()
        if killer:
            killer.join()
    return events


def test_messages_and_responses_streams_end_with_their_error_event():
    # A slow engine (about 10 tokens a second) and no migration: the kill lands mid-stream.
    mesh = start_distributed("etcd", num_workers=1, speedup="0.05",
                             frontend_args=["--enable-anthropic-api", "--migration-limit", "0"])
    try:
        events = stream_until_the_worker_dies(
            mesh, "/v1/messages",
            {"model": "tiny", "max_tokens": 400, "stream": True,
             "messages": [{"role": "user", "content": "tell me a long story"}]},
            {"x-api-key": "unused", "anthropic-version": "2023-06-01"})
        names = [name for name, _ in events]
        assert names[0] == "message_start", names
        assert names[-1] == "error", names
        assert "message_stop" not in names
        name, body = events[-1]
        # A lost worker is the service being unavailable: Anthropic names that overloaded_error.
        assert body["type"] == "error" and body["error"]["type"] == "overloaded_error", body
        assert body["error"]["message"]
        # Each event's name agrees with its type, the error included.
        assert all(data["type"] == event for event, data in events)
    finally:
        mesh.stop()

    mesh = start_distributed("etcd", num_workers=1, speedup="0.05",
                             frontend_args=["--migration-limit", "0"])
    try:
        events = stream_until_the_worker_dies(
            mesh, "/v1/responses",
            {"model": "tiny", "max_output_tokens": 400, "stream": True, "input": "tell me a long story"})
        names = [name for name, _ in events]
        assert names[0] == "response.created", names
        assert names[-1] == "response.failed", names
        assert "response.completed" not in names
        failed = events[-1][1]["response"]
        assert failed["status"] == "failed" and failed["error"]["message"], failed
        numbers = [data["sequence_number"] for _, data in events]
        assert numbers == list(range(len(events)))
    finally:
        mesh.stop()


def test_a_responses_stream_that_finishes_ends_completed():
    mesh = start_distributed("etcd", num_workers=1)
    try:
        with requests.post(f"{mesh.base_url}/v1/responses", stream=True, timeout=60, json={
                "model": "tiny", "stream": True, "input": "hello", "max_output_tokens": 256,
                "temperature": 0,
                # Guided output: the engine writes one small object and stops on its own.
                "text": {"format": {"type": "json_schema", "name": "answer", "schema": {
                    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}},
        }) as r:
            assert r.status_code == 200, r.text
            events = list(sse_events(r))
        names = [name for name, _ in events]
        assert names[0] == "response.created" and names[-1] == "response.completed", names
        completed = events[-1][1]["response"]
        text = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
        assert completed["status"] == "completed"
        assert completed["output"][-1]["content"][0]["text"] == text
        assert isinstance(json.loads(text)["a"], int)
        assert completed["usage"]["output_tokens"] > 0
        assert all(p.alive() for p in mesh.procs)
    finally:
        mesh.stop()
