#!/usr/bin/env bash
# Stops and removes the compose mesh that up.sh started (containers, network, volumes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
COMPOSE_PROFILES=tracing docker-compose -p "${KVMESH_COMPOSE_PROJECT:-kvmesh}" \
  -f "$here/docker-compose.yml" down -v --remove-orphans "$@"
