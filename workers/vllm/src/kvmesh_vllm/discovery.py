"""Registration in the mesh's discovery store, written from the contract alone.

Records are the protobuf messages of discovery.proto stored as canonical proto3 JSON (field names
as in the .proto, 64-bit numbers as decimal strings) under the keys of docs/discovery.md. Two
backends, as the mock engine has them across processes:

- etcd, through etcd's own JSON gateway (`/v3/...`): every key is attached to one lease whose id is
  the instance id; the lease is kept alive every TTL/3 and revoked on shutdown, so a worker that
  dies leaves discovery when its lease runs out.
- files under `DYN_FILE_KV`: each key is a file, touched every TTL/3; a file older than the TTL has
  expired for every reader.
"""
import asyncio
import base64
import json
import logging
import os
import random
import tempfile
import time
from pathlib import Path

import aiohttp
from google.protobuf import json_format

from kvmesh_vllm import names, security

log = logging.getLogger(__name__)

LEASE_TTL_SECS = 10


def record_json(message) -> bytes:
    """A record as the mesh stores it: proto3 JSON with the .proto's field names."""
    as_dict = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return json.dumps(as_dict, separators=(",", ":")).encode()


class LeaseLost(RuntimeError):
    """The store dropped this process's registration (its lease expired or was revoked)."""


class EtcdDiscovery:
    """Keys bound to one etcd lease, kept alive in the background."""

    def __init__(self, endpoints: list[str], ttl: int = LEASE_TTL_SECS):
        self._endpoints = [e.rstrip("/") for e in endpoints]
        self._ttl = ttl
        self._session: aiohttp.ClientSession | None = None
        self.instance_id = 0

    async def _authenticate(self) -> None:
        """Gets a token for ETCD_AUTH_USERNAME (etcd's tokens expire: called again on a 401)."""
        user = security.etcd_user()
        if user is not None:
            self._session.headers.pop("Authorization", None)
            answer = await self._post("/v3/auth/authenticate", {"name": user[0], "password": user[1]},
                                      retry_auth=False)
            self._session.headers["Authorization"] = answer["token"]

    async def _post(self, path: str, body: dict, retry_auth: bool = True) -> dict:
        try:
            return await self._post_once(path, body)
        except PermissionError:
            if not retry_auth or security.etcd_user() is None:
                raise RuntimeError(f"etcd {path}: not authorized") from None
            await self._authenticate()
            return await self._post_once(path, body)

    async def _post_once(self, path: str, body: dict) -> dict:
        last_error = None
        for endpoint in self._endpoints:
            try:
                async with self._session.post(f"{endpoint}{path}", json=body) as response:
                    text = await response.text()
                    if response.status == 401:
                        raise PermissionError(text[:200])
                    if response.status != 200:
                        raise RuntimeError(f"etcd {path}: HTTP {response.status}: {text[:200]}")
                    # Streaming endpoints (keepalive) answer {"result": {...}}.
                    answer = json.loads(text.splitlines()[0])
                    return answer.get("result", answer)
            except (aiohttp.ClientError, asyncio.TimeoutError) as error:
                last_error = error
        raise RuntimeError(f"no etcd endpoint of {self._endpoints} answered {path}: {last_error}")

    async def start(self) -> int:
        """Grants the lease; its id is this worker's instance id."""
        context = security.etcd_ssl()
        connector = aiohttp.TCPConnector(ssl=context) if context is not None else None
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5), connector=connector)
        if context is not None:
            self._endpoints = [e.replace("http://", "https://", 1) for e in self._endpoints]
        await self._authenticate()
        granted = await self._post("/v3/lease/grant", {"TTL": self._ttl})
        self.instance_id = int(granted["ID"])
        return self.instance_id

    async def put(self, key: str, value: bytes) -> None:
        await self._post("/v3/kv/put", {
            "key": base64.b64encode(key.encode()).decode(),
            "value": base64.b64encode(value).decode(),
            "lease": str(self.instance_id),
        })

    async def keep_alive(self) -> None:
        """Refreshes the lease every TTL/3 until cancelled; raises LeaseLost when it is gone."""
        failing_since = None
        while True:
            await asyncio.sleep(self._ttl / 3)
            try:
                answer = await self._post("/v3/lease/keepalive", {"ID": str(self.instance_id)})
            except RuntimeError as error:
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > self._ttl:
                    raise LeaseLost(f"etcd unreachable for longer than the lease TTL: {error}") from error
                log.warning("lease keep-alive failed, retrying: %s", error)
                continue
            failing_since = None
            if int(answer.get("TTL", 0)) <= 0:
                raise LeaseLost(f"lease {self.instance_id:x} expired or was revoked")

    async def close(self) -> None:
        """Revokes the lease (every key goes at once) and closes the connection."""
        if self._session is None:
            return
        try:
            if self.instance_id:
                await self._post("/v3/lease/revoke", {"ID": str(self.instance_id)})
        except RuntimeError as error:
            log.warning("lease revoke failed (the keys expire with the lease): %s", error)
        await self._session.close()


class FileDiscovery:
    """Keys as files under a shared directory, touched while the process lives."""

    def __init__(self, root: Path, ttl: int = LEASE_TTL_SECS):
        self._root = root
        self._ttl = ttl
        self._keys: list[Path] = []
        self.instance_id = 0

    async def start(self) -> int:
        self.instance_id = random.getrandbits(64) or 1
        return self.instance_id

    async def put(self, key: str, value: bytes) -> None:
        path = self._root / key.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = self._root / ".kvmesh-tmp"
        staging.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=staging)
        with os.fdopen(fd, "wb") as out:
            out.write(value)
        os.replace(tmp, path)
        self._keys.append(path)

    async def keep_alive(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self._ttl / 3))
            for path in self._keys:
                try:
                    os.utime(path)
                except FileNotFoundError as error:
                    raise LeaseLost(f"{path} was removed (expired)") from error

    async def close(self) -> None:
        for path in self._keys:
            path.unlink(missing_ok=True)


def open_discovery(backend: str, etcd_endpoints: list[str], file_root: Path | None):
    """The backend `--discovery-backend` names; `mem` only exists inside one process."""
    if backend == "etcd":
        return EtcdDiscovery(etcd_endpoints)
    if backend == "file":
        root = file_root or Path(tempfile.gettempdir()) / "dynamo_store_kv"
        return FileDiscovery(root)
    raise SystemExit(f"--discovery-backend {backend}: a worker in its own process needs etcd or file")
