#!/bin/sh
# Every kvmesh container starts here: unless DYN_TCP_RPC_HOST is set, the mesh's gRPC servers
# bind to and advertise this container's own address (discovery hands it to peers; 0.0.0.0
# would be unreachable for them). Then the command runs as PID 1's only child-free process.
set -e
if [ -z "${DYN_TCP_RPC_HOST:-}" ]; then
  DYN_TCP_RPC_HOST=$(hostname -i | awk '{print $1}')
  export DYN_TCP_RPC_HOST
fi
exec "$@"
