#!/usr/bin/env bash
# Certificates of the TLS compose mesh (docker-compose.tls.yml; docs/deploy.md, "TLS"), made with
# the openssl command line into DIR (default: target/compose-tls):
#
#   DIR/private/ca.key   the CA's key: stays on the host, mounted nowhere
#   DIR/mesh/            ca.pem, tls.crt, tls.key: the mesh members' identity (internal gRPC
#                        both ways, etcd and NATS servers and their clients)
#   DIR/edge/            ca.pem, tls.crt, tls.key: the frontend's HTTPS and KServe gRPC edge;
#                        api-keys: one random client key (--http-api-keys-file)
#
# Scaled replicas get their addresses when they start, so the member certificate names every
# host address of the mesh's fixed /24 network (SUBNET, e.g. 172.31.250.0/24, which the compose
# file gives the network) besides the fixed services' names: `--scale` needs no new certificate.
# Made again only when SUBNET changes.
#
#   deploy/compose/tls/certs.sh [DIR] [SUBNET]
set -euo pipefail
dir=${1:-$(cd "$(dirname "$0")/../../.." && pwd)/target/compose-tls}
subnet=${2:-${KVMESH_TLS_SUBNET:-172.31.250.0/24}}
if [[ ! $subnet =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.0/24$ ]]; then
  echo "error: the TLS mesh's subnet must be a /24 like 172.31.250.0/24 (got $subnet)" >&2
  exit 2
fi
prefix=${BASH_REMATCH[1]}
if [ "$(cat "$dir/subnet" 2>/dev/null)" = "$subnet" ] && [ -s "$dir/edge/api-keys" ]; then
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir/private" "$dir/mesh" "$dir/edge"
curve=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${curve[@]}" -keyout "$dir/private/ca.key" -out "$dir/mesh/ca.pem" -days 825 \
  -subj "/CN=kvmesh compose CA" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
cp "$dir/mesh/ca.pem" "$dir/edge/ca.pem"

# leaf NAME SUBJECT_ALT_NAMES: a server-and-client certificate signed by the CA into DIR/NAME.
leaf() {
  local name=$1 names=$2
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
    "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$names" > "$dir/private/$name.ext"
  openssl req "${curve[@]}" -keyout "$dir/$name/tls.key" -out "$dir/private/$name.csr" \
    -subj "/CN=kvmesh $name" 2>/dev/null
  openssl x509 -req -in "$dir/private/$name.csr" -CA "$dir/mesh/ca.pem" -CAkey "$dir/private/ca.key" \
    -CAserial "$dir/private/ca.srl" -CAcreateserial -days 825 -out "$dir/$name/tls.crt" -extfile "$dir/private/$name.ext" 2>/dev/null
  # The containers run as root; the host user who runs compose keeps the only other access.
  chmod 0644 "$dir/$name/tls.key"
}
members="DNS:localhost,DNS:etcd,DNS:nats,IP:127.0.0.1"
for host in $(seq 1 254); do
  members+=",IP:$prefix.$host"
done
leaf mesh "$members"
leaf edge "DNS:localhost,DNS:frontend,IP:127.0.0.1"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/edge/api-keys"
echo >> "$dir/edge/api-keys"
echo "$subnet" > "$dir/subnet"
echo "compose TLS certificates for $subnet in $dir" >&2
