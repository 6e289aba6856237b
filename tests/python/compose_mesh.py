"""The compose mesh (deploy/compose) as the tests drive it: `up.sh` under a project name of its
own with free host ports, the binaries already built (KVMESH_BIN_DIR), torn down by `down.sh`.
With `tls=True` it is the hardened variant (docker-compose.tls.yml) on a random /24 with its own
certificates, and `session` is a requests session that trusts the edge CA and sends the API key."""
import contextlib
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import requests

from conftest import BIN_DIR, ROOT, free_port

COMPOSE = ROOT / "deploy" / "compose"


def docker_ok():
    return shutil.which("docker-compose") is not None and subprocess.run(
        ["docker", "info"], capture_output=True).returncode == 0


def docker_logs(container):
    logs = subprocess.run(["docker", "logs", container], capture_output=True, text=True)
    return logs.stdout + logs.stderr


class ComposeMesh:
    def __init__(self, tls=False):
        self.project = f"kvmeshtest{uuid.uuid4().hex[:8]}"
        self.http_port = free_port()
        self.kserve_port = free_port()
        self.env = dict(os.environ, KVMESH_COMPOSE_PROJECT=self.project, KVMESH_SKIP_BUILD="1",
                        KVMESH_BIN_DIR=str(BIN_DIR), KVMESH_HTTP_PORT=str(self.http_port),
                        KVMESH_KSERVE_PORT=str(self.kserve_port), KVMESH_OTEL_QUERY_PORT=str(free_port()))
        self.files = [COMPOSE / "docker-compose.yml"]
        self.tls = tls
        self.session = requests.Session()
        self.base_url = f"http://127.0.0.1:{self.http_port}"
        if tls:
            self.tls_dir = Path(tempfile.mkdtemp(prefix="kvmesh-compose-tls-"))
            self.env.update(KVMESH_TLS="1", KVMESH_TLS_DIR=str(self.tls_dir),
                            KVMESH_TLS_SUBNET=f"172.31.{random.randrange(200, 250)}.0/24")
            self.files.append(COMPOSE / "docker-compose.tls.yml")
            self.base_url = f"https://127.0.0.1:{self.http_port}"

    @property
    def edge_ca(self):
        return self.tls_dir / "edge" / "ca.pem"

    @property
    def api_key(self):
        return (self.tls_dir / "edge" / "api-keys").read_text().strip()

    @contextlib.contextmanager
    def up(self, *args):
        """Starts the mesh with `up.sh ARGS`; yields it; prints the logs on failure; removes it."""
        started = time.monotonic()
        up = subprocess.run([str(COMPOSE / "up.sh"), *args], env=self.env, capture_output=True, text=True)
        print(f"compose mesh up in {time.monotonic() - started:.0f} s", up.stderr[-2000:])
        try:
            assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
            if self.tls:
                # Not from the environment: REQUESTS_CA_BUNDLE would win over `verify`.
                self.session.trust_env = False
                self.session.verify = str(self.edge_ca)
                self.session.headers["authorization"] = f"Bearer {self.api_key}"
            yield self
        except BaseException:
            self.logs()
            raise
        finally:
            subprocess.run([str(COMPOSE / "down.sh")], env=self.env, capture_output=True)
            if self.tls:
                shutil.rmtree(self.tls_dir, ignore_errors=True)

    def compose(self, *args, check=True):
        files = [arg for path in self.files for arg in ("-f", str(path))]
        return subprocess.run(["docker-compose", "-p", self.project, *files, *args], env=self.env, check=check,
                              capture_output=True, text=True)

    def containers(self, service):
        return self.compose("ps", "-q", service).stdout.split()

    def health(self, container):
        return subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", container],
                              capture_output=True, text=True).stdout.strip()

    def healthcheck(self, container):
        """Runs the container's own health check command now; its exit status."""
        test = subprocess.run(["docker", "inspect", "-f", "{{json .Config.Healthcheck.Test}}", container],
                              capture_output=True, text=True, check=True).stdout
        kind, *command = json.loads(test)
        if kind == "CMD-SHELL":
            command = ["sh", "-c", command[0]]
        return subprocess.run(["docker", "exec", container, *command], capture_output=True).returncode

    def address(self, container):
        """The container's address on the mesh's network."""
        return subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                               container], capture_output=True, text=True, check=True).stdout.strip()

    def logs(self):
        print(self.compose("logs", "--no-color", "--tail", "80", check=False).stdout)

    def assert_healthy(self, expected):
        """Each service of `expected` (name → containers) has that many, all healthy, and each
        container's own health check passes now."""
        from conftest import wait_until
        for service, count in expected.items():
            containers = self.containers(service)
            assert len(containers) == count, (service, containers)
            for container in containers:
                wait_until(lambda c=container: self.health(c) == "healthy", timeout=60,
                           what=f"{service} healthy")
                assert self.healthcheck(container) == 0, service
