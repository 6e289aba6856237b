#!/usr/bin/env bash
# Failure drills on the compose mesh (docs/deploy.md, "Drills"): starts it with up.sh unless
# KVMESH_DRILL_RUNNING=1 says it is up, then under load kills a router container, an indexer
# replica, a mock worker, NATS and etcd in turn (each held down `--hold` seconds, then started
# again) and prints one JSON line per drill: requests, failed, longest gap without a completed
# request, seconds until the part was healthy again. Bounded: each drill takes hold + recovery
# (at most --recover-limit) + 5 s. Arguments go to drill.py (--callers, --hold, --services,
# --throughput SECONDS for a no-fault requests/s figure first).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${KVMESH_DRILL_RUNNING:-}" ]; then
  "$here/up.sh" --scale router=3
fi
exec timeout 600 python3 "$here/drill.py" --project "${KVMESH_COMPOSE_PROJECT:-kvmesh}" \
  --file "$here/docker-compose.yml" --base "http://127.0.0.1:${KVMESH_HTTP_PORT:-8000}" "$@"
