"""`aiperf` (NVIDIA's benchmark client, pinned in scripts/test.sh, run offline with its tokenizer
pointed at the model directory) against `kvmesh up`: every request completes, and the output
lengths aiperf counts by re-tokenizing the text agree with the server's usage and with the
requested output length (the mock engine writes whole-word tokens that re-tokenize to
themselves)."""
import json
import os
import pathlib
import subprocess

import pytest

from test_admission import start_up

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def aiperf():
    path = os.environ.get("KVMESH_AIPERF")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("KVMESH_AIPERF is not set to the aiperf executable (run scripts/test.sh)")
    return path


@pytest.fixture(scope="module")
def mesh():
    mesh = start_up("up-aiperf", ["--speedup-ratio", "100"])
    yield mesh
    mesh.stop()


@pytest.mark.parametrize("endpoint,streaming", [("chat", True), ("completions", False)])
def test_aiperf_reports_no_output_length_mismatch(aiperf, mesh, tmp_path, endpoint, streaming):
    args = [aiperf, "profile", "--model", "tiny", "--url", mesh.base_url, "--endpoint-type", endpoint,
            "--tokenizer", str(ROOT / "models" / "tiny"), "--request-count", "24", "--concurrency", "4",
            "--synthetic-input-tokens-mean", "120", "--output-tokens-mean", "32", "--random-seed", "7",
            "--artifact-dir", str(tmp_path), "--ui-type", "none"]
    if streaming:
        args.append("--streaming")
    env = dict(os.environ, HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1")
    run = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    metrics = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert metrics["request_count"]["avg"] == 24
    assert metrics.get("error_request_count", {}).get("avg", 0) == 0
    assert metrics["osl_mismatch_count"]["avg"] == 0
    assert metrics["usage_discrepancy_count"]["avg"] == 0
    # aiperf's own count of the output tokens (re-tokenizing the text) equals the server's usage.
    assert metrics["usage_completion_tokens_diff_pct"]["max"] == 0
    assert metrics["output_sequence_length"]["avg"] == 32
