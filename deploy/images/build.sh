#!/usr/bin/env bash
# Builds every kvmesh image from binaries already built on the host (nothing compiles in a
# container): kvmesh-mesh (every binary, the tiny model, the compose mesh's processor) and from it
# kvmesh-{etcd,nats,frontend,router,indexer,mocker,processor-host,kv-bridge,kvmesh} and, once it
# is built, kvmesh-otel-collector, each with its own command, all tagged $KVMESH_IMAGE_TAG
# (default `latest`).
#
#   KVMESH_BIN_DIR  where the binaries are (default target/debug; target/release works too)
#   KVMESH_BASE     base image (default: rootfs.sh's, made from Debian packages with no registry;
#                   `debian:bookworm-slim` where a registry is at hand)
#
# The binaries are copied in without their debug sections. The build is skipped when the staged
# context (binaries, models, processors, Dockerfile) and the base are unchanged since the last one.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin_dir=${KVMESH_BIN_DIR:-$root/target/debug}
tag=${KVMESH_IMAGE_TAG:-latest}
base=${KVMESH_BASE:-$("$here/rootfs.sh")}
binaries=(kvmesh kvmesh-frontend kvmesh-router kvmesh-indexer kvmesh-mocker kvmesh-processor-host
  kvmesh-kv-bridge)
# Each image: its name and its command (the `mesh` image holds every binary).
images=("etcd etcd" "nats nats-server -js" "kvmesh kvmesh up" "frontend kvmesh-frontend"
  "router kvmesh-router" "indexer kvmesh-indexer" "mocker kvmesh-mocker"
  "kv-bridge kvmesh-kv-bridge" "processor-host kvmesh-processor-host")
if [ -x "$bin_dir/kvmesh-otel-collector" ]; then
  binaries+=(kvmesh-otel-collector)
  images+=("otel-collector kvmesh-otel-collector")
fi

ctx=$(mktemp -d /tmp/kvmesh-images.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin" "$ctx/models"
for binary in "${binaries[@]}"; do
  [ -x "$bin_dir/$binary" ] || { echo "error: $bin_dir/$binary is not built" >&2; exit 1; }
  strip --strip-debug -o "$ctx/bin/$binary" "$bin_dir/$binary"
done
cp -r "$root/models/tiny" "$ctx/models/tiny"
cp -r "$root/deploy/compose/processors" "$ctx/processors"
cp "$here/Dockerfile" "$here/entrypoint.sh" "$ctx/"
key=$( (echo "$base $(docker image inspect -f '{{.Id}}' "$base")"; cd "$ctx" && find . -type f | sort | xargs sha256sum) | sha256sum | cut -c1-16)
if [ "$(docker image inspect -f '{{index .Config.Labels "kvmesh.key"}}' "kvmesh-frontend:$tag" 2>/dev/null)" = "$key" ] \
  && { [ ! -x "$bin_dir/kvmesh-otel-collector" ] || docker image inspect "kvmesh-otel-collector:$tag" >/dev/null 2>&1; }; then
  echo "images unchanged ($key)" >&2
  exit 0
fi
started=$(date +%s)
docker build -q --build-arg BASE="$base" --target mesh -t "kvmesh-mesh:$tag" "$ctx" >/dev/null
for image in "${images[@]}"; do
  read -r name command <<<"$image"
  cmd=$(printf '"%s",' $command)
  printf 'FROM kvmesh-mesh:%s\nLABEL kvmesh.key=%s\nCMD [%s]\n' "$tag" "$key" "${cmd%,}" |
    docker build -q -t "kvmesh-$name:$tag" - >/dev/null
done
echo "images built in $(($(date +%s) - started)) s ($key)" >&2
