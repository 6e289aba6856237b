#!/usr/bin/env bash
# Builds the kvmesh binaries (cargo, on the host) and images (deploy/images/build.sh: no
# registry needed), then starts the compose mesh and waits until every service is healthy:
# OpenAI HTTP on host port 8000 ($KVMESH_HTTP_PORT), KServe gRPC on 8787 ($KVMESH_KSERVE_PORT).
# Arguments go to `docker-compose up`, e.g. `--scale router=3 --scale mocker=4`.
#
#   KVMESH_PROFILE=release   build and ship release binaries (default: debug)
#   KVMESH_SKIP_BUILD=1      use the binaries already built
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
profile=${KVMESH_PROFILE:-debug}
target_dir=${CARGO_TARGET_DIR:-$root/target}
if [ -z "${KVMESH_SKIP_BUILD:-}" ]; then
  flags=(--workspace --bins)
  [ "$profile" = release ] && flags+=(--release)
  (cd "$root" && cargo build "${flags[@]}")
fi
KVMESH_BIN_DIR=${KVMESH_BIN_DIR:-$target_dir/$profile} "$root/deploy/images/build.sh"
compose=(docker-compose -p "${KVMESH_COMPOSE_PROJECT:-kvmesh}" -f "$here/docker-compose.yml")
if docker image inspect "kvmesh-otel-collector:${KVMESH_IMAGE_TAG:-latest}" >/dev/null 2>&1; then
  export COMPOSE_PROFILES=tracing
fi
"${compose[@]}" up -d "$@"
# `up -d` returns once dependencies are healthy; the frontend itself is last.
for _ in $(seq 1 150); do
  status=$(docker inspect -f '{{.State.Health.Status}}' "$("${compose[@]}" ps -q frontend)" 2>/dev/null || true)
  if [ "$status" = healthy ]; then
    echo "kvmesh mesh up: http://127.0.0.1:${KVMESH_HTTP_PORT:-8000}/v1 (KServe gRPC 127.0.0.1:${KVMESH_KSERVE_PORT:-8787})"
    exit 0
  fi
  sleep 2
done
"${compose[@]}" ps >&2
echo "error: the frontend did not become healthy; see: ${compose[*]} logs" >&2
exit 1
