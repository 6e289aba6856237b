"""Failure drills on the running compose mesh (drill.sh runs them): under a steady load of
completions through the frontend, each drill stops one part (a router container, an indexer
replica, a mock worker, NATS, etcd) abruptly, holds it down, starts it again, and reports the
requests that failed, the longest stretch without a completed request, and how long the part took
to be healthy again. Also measures the mesh's requests/s with no fault (`--throughput`).
Standard library only."""
import argparse
import json
import subprocess
import threading
import time
import urllib.request


def complete(base, caller, i, timeout=30):
    body = json.dumps({"model": "tiny", "prompt": f"drill caller {caller} request {i} " * 4,
                       "max_tokens": 8}).encode()
    request = urllib.request.Request(f"{base}/v1/completions", data=body,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status == 200
    except Exception:  # noqa: BLE001 - any failure counts
        return False


class Load:
    def __init__(self, base, callers):
        self.base, self.callers = base, callers
        self.results, self.stop = [], threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(c,), daemon=True) for c in range(callers)]

    def run(self, caller):
        i = 0
        while not self.stop.is_set():
            i += 1
            ok = complete(self.base, caller, i)
            with self.lock:
                self.results.append((time.monotonic(), ok))

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def window(self, start, end):
        with self.lock:
            return [(t, ok) for t, ok in self.results if start <= t <= end]


def compose(args, *rest):
    return subprocess.run(["docker-compose", "-p", args.project, "-f", args.file, *rest],
                          capture_output=True, text=True, check=True).stdout


def health(container):
    return subprocess.run(["docker", "inspect", "-f", "{{.State.Health.Status}}", container],
                          capture_output=True, text=True).stdout.strip()


def drill(args, load, service):
    container = compose(args, "ps", "-q", service).split()[0]
    time.sleep(2)
    fault = time.monotonic()
    subprocess.run(["docker", "kill", container], capture_output=True, check=True)
    time.sleep(args.hold)
    subprocess.run(["docker", "start", container], capture_output=True, check=True)
    deadline = time.monotonic() + args.recover_limit
    while health(container) != "healthy" and time.monotonic() < deadline:
        time.sleep(0.2)
    healthy = time.monotonic()
    time.sleep(3)
    results = load.window(fault, time.monotonic())
    failed = sum(1 for _, ok in results if not ok)
    times = [fault] + [t for t, ok in results if ok]
    gap = max((b - a for a, b in zip(times, times[1:])), default=0.0)
    return {"drill": f"kill {service}", "requests": len(results), "failed": failed,
            "longest_gap_s": round(gap, 2), "back_healthy_s": round(healthy - fault, 1)}


def throughput(base, callers, seconds):
    with Load(base, callers) as load:
        time.sleep(seconds)
    ok = sum(1 for _, good in load.results if good)
    return {"callers": callers, "seconds": seconds, "completed": ok,
            "failed": len(load.results) - ok, "req_per_s": round(ok / seconds, 1)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--project", default="kvmesh")
    parser.add_argument("--file", required=True)
    parser.add_argument("--callers", type=int, default=8)
    parser.add_argument("--hold", type=float, default=5.0, help="seconds a part stays down")
    parser.add_argument("--recover-limit", type=float, default=60.0)
    parser.add_argument("--services", default="router,indexer-0,mocker,nats,etcd")
    parser.add_argument("--throughput", type=float, default=0.0, help="seconds of a no-fault run first")
    args = parser.parse_args()
    if args.throughput:
        print(json.dumps(throughput(args.base, args.callers, args.throughput)), flush=True)
    with Load(args.base, args.callers) as load:
        for service in args.services.split(","):
            print(json.dumps(drill(args, load, service)), flush=True)


if __name__ == "__main__":
    main()
