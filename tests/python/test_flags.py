"""Every Dynamo frontend launch option starts kvmesh-frontend: each flag of Dynamo 1.6.1's
`--help` and each environment variable of Dynamo's frontend guide, listed with a value in
data/dynamo_frontend_options.json. Options kvmesh does not implement yet must log one WARN naming
them; the edge's TLS serves HTTPS; the internal gRPC's and NATS's TLS start (a NATS that does not
offer TLS leaves the frontend without an event plane, with one WARN), half of a certificate/key
pair and keyed tracking hashes must refuse to start naming the flag; `--interactive` runs the REPL instead of HTTP and answers a typed prompt."""
import glob
import itertools
import json
import os
import re
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from conftest import BIN_DIR, free_port
from pki import Ca

HERE = Path(__file__).resolve().parent
OPTIONS = json.loads((HERE / "data" / "dynamo_frontend_options.json").read_text())
# The option names of Dynamo's sources (see extract_sources), kept here so the coverage check
# does not depend on them being present.
SOURCES = json.loads((HERE / "data" / "dynamo_sources.json").read_text())
REPO = HERE.parent.parent
MODEL_DIR = REPO / "models" / "tiny"
SHARED = Path(os.environ.get("KVMESH_SHARED_DIR", REPO.parent / "shared"))


@pytest.fixture(scope="module")
def files():
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "policy.yaml").write_text("policy_classes: []\n")
        (tmp / "cert.pem").write_text("-----BEGIN CERTIFICATE-----\n")
        ca = Ca(tmp / "pki")
        cert, key = ca.issue("kvmesh-edge", 1)
        for name, path in (("ca.pem", ca.pem), ("edge.pem", cert), ("edge.key", key)):
            (tmp / name).write_bytes(path.read_bytes())
        yield tmp


def fill(value, files, ports, out):
    return (value.replace("{file}", str(files / "policy.yaml"))
            .replace("{pem}", str(files / "cert.pem"))
            .replace("{cert}", str(files / "edge.pem"))
            .replace("{key}", str(files / "edge.key"))
            .replace("{ca}", str(files / "ca.pem"))
            .replace("{dir}", str(MODEL_DIR))
            .replace("{port2}", str(ports[1]))
            .replace("{port}", str(ports[0]))
            .replace("{out}", str(out)))


def launch(args, env, expect, files):
    """Starts the frontend (file discovery in a private directory, HTTP on a free port), waits
    for the outcome `expect` names, and returns (ok, what it printed)."""
    ports = (free_port(), free_port())
    with tempfile.TemporaryDirectory() as kv:
        out = Path(kv) / "dump.json"
        base = {"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": kv, "DYN_HTTP_HOST": "127.0.0.1",
                "DYN_HTTP_PORT": str(ports[0]), "DYN_TCP_RPC_PORT": str(free_port()),
                "NATS_SERVER": os.environ.get("NATS_SERVER", "nats://127.0.0.1:1")}
        full_env = {**os.environ, **base, **{k: fill(v, files, ports, out) for k, v in env.items()}}
        argv = [str(BIN_DIR / "kvmesh-frontend"), *(fill(a, files, ports, out) for a in args)]
        if expect == "kserve_env":
            argv += ["--grpc-metrics-port", str(ports[1])]
        proc = subprocess.Popen(argv, env=full_env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            return wait_outcome(proc, expect, ports, files), proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def wait_outcome(proc, expect, ports, files):
    live = {"kserve": (ports[1], "/live"), "kserve_env": (ports[1], "/live"),
            "live_moved": (ports[0], "/x/live")}.get(expect, (ports[0], "/live"))
    deadline = time.time() + 20
    while time.time() < deadline:
        if proc.poll() is not None:
            return expect == "refused" and proc.returncode == 2
        if expect == "interactive":
            # No HTTP at all: the REPL waits for a model, and nothing listens on the port.
            time.sleep(1.0)
            if proc.poll() is not None:
                return False
            try:
                requests.get(f"http://127.0.0.1:{ports[0]}/live", timeout=0.5)
                return False
            except requests.ConnectionError:
                return True
        if expect == "tls":
            # Verified against the test CA, with a client certificate for --tls-client-ca-cert-path.
            try:
                r = requests.get(f"https://127.0.0.1:{ports[0]}/live", timeout=0.5, verify=str(files / "ca.pem"),
                                 cert=(str(files / "edge.pem"), str(files / "edge.key")))
                if r.status_code == 200:
                    return True
            except requests.RequestException:
                pass
        elif expect != "refused":
            try:
                if requests.get(f"http://127.0.0.1:{live[0]}{live[1]}", timeout=0.5).status_code == 200:
                    return True
            except requests.RequestException:
                pass
        time.sleep(0.05)
    return False


def check(entry, files, args, env, name):
    ok, proc = launch(args, env, entry["expect"], files)
    output = proc.stdout.read()
    problems = []
    if not ok:
        problems.append(f"{name}: expected {entry['expect']}, rc={proc.returncode}\n{output[-1500:]}")
    elif entry["expect"] == "refused" and name.split("=")[0] not in output:
        problems.append(f"{name}: refused without naming it\n{output[-800:]}")
    warnings = [line for line in output.splitlines() if "WARN" in line]
    if ok and entry.get("warn"):
        warned = [line for line in warnings if entry["warn"] in line]
        if len(warned) != 1 or len(warnings) != 1:
            problems.append(f"{name}: expected one WARN, with {entry['warn']!r}\n{output[-1500:]}")
    elif ok and entry["expect"] != "refused" and warnings:
        # An option that is implemented does not warn; one that is not must say so (its entry
        # then names the WARN).
        problems.append(f"{name}: unexpected WARN\n" + "\n".join(warnings))
    return problems


def run_all(cases):
    with ThreadPoolExecutor(max_workers=6) as pool:
        problems = [p for result in pool.map(lambda case: check(*case), cases) for p in result]
    assert not problems, "\n\n".join(problems)


def test_every_dynamo_flag_starts_the_frontend(files):
    cases = []
    for entry in OPTIONS["flags"]:
        args = [entry["flag"], *entry["args"]] if entry["args"] is not None else []
        cases.append((entry, files, args, {}, entry["flag"]))
    run_all(cases)


def test_every_dynamo_environment_variable_starts_the_frontend(files):
    cases = [(entry, files, [], {entry["env"]: entry["value"]}, entry["env"])
             for entry in OPTIONS["env"]]
    run_all(cases)


# Variables every launch sets itself (a private file-discovery root, free ports, the servers).
SET_BY_THE_HARNESS = {"DYN_FILE_KV", "DYN_TCP_RPC_PORT", "ETCD_ENDPOINTS", "NATS_SERVER"}


def expand_braces(name):
    """`DYN_METRICS_{A,B}_{MIN,MAX}` -> every combination, as the flags spec writes families."""
    parts = re.split(r"(\{[^}]*\})", name)
    choices = [part[1:-1].split(",") if part.startswith("{") else [part] for part in parts]
    return ["".join(combination) for combination in itertools.product(*choices)]


def extract_sources(shared):
    """The option names of Dynamo's sources under `shared`: the flags and variables of the
    1.6.1 frontend's --help, the variables of the frontend guide (seed 002), and the variables of
    the flags spec. None when the sources are not there."""
    help_text = shared / "specs" / "dynamo-1.6.1-frontend-help.txt"
    guides = glob.glob(str(shared / "seeds" / "002_*.txt"))
    spec = shared / "specs" / "frontend-flags.md"
    if not help_text.exists() or not guides or not spec.exists():
        return None
    help_text = help_text.read_text()
    option_lines = [line for line in help_text.splitlines() if line.startswith("  -")]
    help_flags = {flag for line in option_lines
                  for flag in re.findall(r"(?<![\w-])(-i|--[a-z][a-z0-9-]+)", line)}
    env = r"\b(?:DYN|NATS|ETCD)_[A-Z0-9_]+"
    spec_env = {expanded for name in re.findall(r"`((?:DYN|NATS|ETCD|KVMESH)_[A-Z0-9_{},]+)`",
                                                 spec.read_text())
                for expanded in expand_braces(name) if not expanded.endswith("_")}
    return {"help_flags": sorted(help_flags - {"--help", "--version"}),
            "help_env": sorted(set(re.findall(env, help_text))),
            "guide_env": sorted(set(re.findall(env, Path(guides[0]).read_text()))),
            "spec_env": sorted(spec_env)}


def test_the_list_covers_dynamos_help_guide_and_spec():
    """The option list covers the names of Dynamo's sources, kept in the repository (so the
    check runs wherever the tests do)."""
    listed_flags = {entry["flag"] for entry in OPTIONS["flags"]}
    listed_env = {entry["env"] for entry in OPTIONS["env"]} | SET_BY_THE_HARNESS
    assert sorted(set(SOURCES["help_flags"]) - listed_flags) == []
    for source in ("help_env", "guide_env", "spec_env"):
        assert sorted(set(SOURCES[source]) - listed_env) == [], source
    assert len(SOURCES["help_flags"]) > 100 and len(SOURCES["guide_env"]) > 50


def test_the_kept_names_match_dynamos_sources():
    extracted = extract_sources(SHARED)
    if extracted is None:
        pytest.skip(f"Dynamo's --help capture, guide and flags spec are not at {SHARED}")
    assert extracted == SOURCES, "tests/python/data/dynamo_sources.json is out of date"


def test_invalid_values_still_fail_naming_the_flag(files):
    for args, flag in [(["--shared-cache-type", "redis"], "--shared-cache-type"),
                       (["--router-conditional-disagg-config", '{"nope": 1}'], "--router-conditional-disagg-config"),
                       (["--ais-tp-size", "0"], "--ais-tp-size"),
                       (["--router-prefill-load-model", "aic"], "--router-prefill-load-model"),
                       (["--reasoning-field-name", "thoughts"], "--reasoning-field-name"),
                       (["--dyn-chat-processor-config", "[1]"], "--dyn-chat-processor-config"),
                       (["--response-plane", "quic"], "--response-plane"),
                       (["--router-policy-config", "/no/such.yaml"], "--router-policy-config")]:
        r = subprocess.run([str(BIN_DIR / "kvmesh-frontend"), *args], capture_output=True, text=True,
                           timeout=20)
        assert r.returncode == 2 and flag in r.stderr, (args, r.stderr)


def test_interactive_answers_a_typed_prompt():
    proc = subprocess.run([str(BIN_DIR / "kvmesh"), "up", "--http-port", str(free_port()),
                           "--tcp-rpc-port", str(free_port()), "--num-workers", "1", "-i"],
                          input="Hello there\nAnd again\n", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    header, _, session = proc.stdout.partition("\n")
    assert "interactive chat with tiny" in header
    # A prompt, an answer, a prompt, an answer, and the prompt that met the end of input.
    turns = session.split("user> ")
    assert len(turns) == 4 and turns[-1] == "", proc.stdout
    assert all(turn.strip() for turn in turns[1:3]), proc.stdout
