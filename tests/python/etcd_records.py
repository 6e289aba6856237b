"""Reads the mesh's discovery records straight from etcd (its JSON gateway), as any peer would."""
import base64
import json

import requests

from conftest import require_env


def _range(prefix: str) -> list[dict]:
    endpoint = require_env("ETCD_ENDPOINTS").split(",")[0].rstrip("/")
    key = prefix.encode()
    end = key[:-1] + bytes([key[-1] + 1])
    r = requests.post(f"{endpoint}/v3/kv/range", json={
        "key": base64.b64encode(key).decode(), "range_end": base64.b64encode(end).decode()}, timeout=5)
    r.raise_for_status()
    return [json.loads(base64.b64decode(kv["value"])) for kv in r.json().get("kvs", [])]


def instance_records(namespace: str) -> list[dict]:
    return _range(f"/kvmesh/{namespace}/instances/")


def model_records(namespace: str) -> list[dict]:
    return _range(f"/kvmesh/{namespace}/models/")
