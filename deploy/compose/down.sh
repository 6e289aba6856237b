#!/usr/bin/env bash
# Stops and removes the compose mesh that up.sh started (containers, network, volumes);
# KVMESH_TLS=1 as for up.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
files=(-f "$here/docker-compose.yml")
if [ -n "${KVMESH_TLS:-}" ]; then
  # The TLS file only adds to the same services and network; its certificate paths are not read.
  export KVMESH_TLS_DIR=${KVMESH_TLS_DIR:-unused}
  files+=(-f "$here/docker-compose.tls.yml")
fi
COMPOSE_PROFILES=tracing docker-compose -p "${KVMESH_COMPOSE_PROJECT:-kvmesh}" "${files[@]}" \
  down -v --remove-orphans "$@"
