#!/usr/bin/env bash
# Makes the base image every kvmesh image starts from, with no registry: a Debian bookworm root
# filesystem from Debian's own packages (debootstrap, minbase variant) with etcd, NATS, CA
# certificates and the CPython 3.11 runtime the processor host embeds, `docker import`ed as
# kvmesh-rootfs:<key>. The key hashes everything the filesystem is made from (this script, the
# suite, the mirror, the package list), so an unchanged recipe is never rebuilt; the tarball is also
# kept under $KVMESH_IMAGE_CACHE (default ~/.cache/kvmesh/images) for a machine whose docker lost it.
#
# Prints the image's name. Needs debootstrap, docker and root (sudo when not root).
set -euo pipefail
cd "$(dirname "$0")"
suite=bookworm
mirror=${KVMESH_DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages=ca-certificates,etcd-server,nats-server,libpython3.11,tzdata
key=$( (cat rootfs.sh; echo "$suite $mirror $packages") | sha256sum | cut -c1-16)
image=kvmesh-rootfs:$key
cache=${KVMESH_IMAGE_CACHE:-$HOME/.cache/kvmesh/images}
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"; exit 0
fi
tarball=$cache/rootfs-$key.tar.gz
sudo_rm() { if [ "$(id -u)" -eq 0 ]; then rm -rf "$1"; else sudo rm -rf "$1"; fi; }
if [ ! -s "$tarball" ]; then
  mkdir -p "$cache"
  work=$(mktemp -d /tmp/kvmesh-rootfs.XXXXXX)
  trap 'sudo_rm "$work"' EXIT
  started=$(date +%s)
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo debootstrap --variant=minbase --include="$packages" "$suite" "$work/root" "$mirror" >&2
  # What an image needs no copy of: package lists, caches, documentation.
  $sudo rm -rf "$work/root"/var/lib/apt/lists/* "$work/root"/var/cache/apt/*.bin \
    "$work/root"/var/cache/apt/archives/*.deb "$work/root"/usr/share/doc/* "$work/root"/usr/share/man/*
  $sudo tar -C "$work/root" -czf "$tarball.tmp" .
  $sudo chown "$(id -u):$(id -g)" "$tarball.tmp"
  mv "$tarball.tmp" "$tarball"
  echo "rootfs $key made in $(($(date +%s) - started)) s" >&2
fi
docker import "$tarball" "$image" >/dev/null
echo "$image"
