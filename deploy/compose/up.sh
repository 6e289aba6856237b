#!/usr/bin/env bash
# Builds the kvmesh binaries (cargo, on the host) and images (deploy/images/build.sh: no
# registry needed), then starts the compose mesh and waits until every service is healthy:
# OpenAI HTTP on host port 8000 ($KVMESH_HTTP_PORT), KServe gRPC on 8787 ($KVMESH_KSERVE_PORT).
# Arguments go to `docker-compose up`, e.g. `--scale router=3 --scale mocker=4`.
#
#   KVMESH_PROFILE=release   build and ship release binaries (default: debug)
#   KVMESH_SKIP_BUILD=1      use the binaries already built
#   KVMESH_TLS=1             the hardened mesh (docker-compose.tls.yml): mutual TLS inside, etcd
#                            and NATS over TLS, HTTPS and an API key at the edge; certificates
#                            from tls/certs.sh in $KVMESH_TLS_DIR (default target/compose-tls)
#                            for the network $KVMESH_TLS_SUBNET (default 172.31.250.0/24)
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
scheme=http
if [ -n "${KVMESH_TLS:-}" ]; then
  export KVMESH_TLS_DIR=${KVMESH_TLS_DIR:-$target_dir/compose-tls}
  "$here/tls/certs.sh" "$KVMESH_TLS_DIR" "${KVMESH_TLS_SUBNET:-172.31.250.0/24}"
  compose+=(-f "$here/docker-compose.tls.yml")
  scheme=https
fi
if docker image inspect "kvmesh-otel-collector:${KVMESH_IMAGE_TAG:-latest}" >/dev/null 2>&1; then
  export COMPOSE_PROFILES=tracing
fi
"${compose[@]}" up -d "$@"
# `up -d` returns once dependencies are healthy; the frontend itself is last.
for _ in $(seq 1 150); do
  status=$(docker inspect -f '{{.State.Health.Status}}' "$("${compose[@]}" ps -q frontend)" 2>/dev/null || true)
  if [ "$status" = healthy ]; then
    echo "kvmesh mesh up: $scheme://127.0.0.1:${KVMESH_HTTP_PORT:-8000}/v1 (KServe gRPC 127.0.0.1:${KVMESH_KSERVE_PORT:-8787})"
    if [ "$scheme" = https ]; then
      echo "CA: $KVMESH_TLS_DIR/edge/ca.pem; API key: $KVMESH_TLS_DIR/edge/api-keys"
    fi
    exit 0
  fi
  sleep 2
done
"${compose[@]}" ps >&2
echo "error: the frontend did not become healthy; see: ${compose[*]} logs" >&2
exit 1
