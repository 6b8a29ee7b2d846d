#!/usr/bin/env bash
# Makes a throw-away certificate authority and certificates for spes sync TLS:
#   DIR/ca.pem, DIR/ca.key            the CA
#   DIR/node.pem, DIR/node.key        one certificate for every node (server and client use)
# The node certificate is valid for the names and IPs given (default: localhost, 127.0.0.1).
# For a real cluster make one certificate per node with its public address (see docs/protocol.md).
# usage: scripts/make_test_ca.sh DIR [SAN ...]   e.g. scripts/make_test_ca.sh tls DNS:node1.example IP:203.0.113.7
set -euo pipefail
dir=${1:?usage: make_test_ca.sh DIR [SAN ...]}
shift || true
sans=("$@")
if [ ${#sans[@]} -eq 0 ]; then sans=(DNS:localhost IP:127.0.0.1); fi
san=$(IFS=,; echo "${sans[*]}")
mkdir -p "$dir"
cd "$dir"
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=spes test CA" \
  -keyout ca.key -out ca.pem 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=spes node" -keyout node.key -out node.csr 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" > node.ext
openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
  -extfile node.ext -out node.pem 2>/dev/null
rm -f node.csr node.ext ca.srl
chmod 600 ca.key node.key
echo "made $dir/ca.pem and $dir/node.{pem,key} for $san"
