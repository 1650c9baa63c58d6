#!/usr/bin/env bash
# Makes throwaway TLS material for the TLS tests and the server demo, with the
# openssl command, in DIR (created; keys 0600). Nothing here is committed.
#
#   tests/tls_certs.sh DIR
#
#   ca.pem, ca.key            a test CA
#   server.pem, server.key    signed by ca: localhost, 127.0.0.1, ::1
#   wrong-host.pem/.key       signed by ca, for example.invalid only
#   other-ca.pem, other-ca.key  a second CA nobody trusts
#   other.pem, other.key      signed by other-ca: localhost, 127.0.0.1
#   client.pem, client.key    a client certificate signed by ca
set -euo pipefail
dir=${1:?usage: tls_certs.sh DIR}
mkdir -p "$dir"
cd "$dir"
umask 077
quiet() { "$@" >/dev/null 2>&1 || { echo "tls_certs.sh: $* failed" >&2; "$@"; exit 1; }; }

ca() {  # NAME SUBJECT
  quiet openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=$2" -keyout "$1.key" -out "$1.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
}
leaf() {  # NAME CA SAN [EXTRA openssl x509 args] (the SAN "" makes a client certificate)
  local name=$1 issuer=$2 san=$3
  shift 3
  quiet openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
    -keyout "$name.key" -out "$name.csr"
  {
    echo "basicConstraints=CA:FALSE"
    if [[ -n $san ]]; then
      echo "subjectAltName=$san"
      echo "extendedKeyUsage=serverAuth"
    else
      echo "extendedKeyUsage=clientAuth"
    fi
  } >"$name.ext"
  quiet openssl x509 -req -in "$name.csr" -CA "$issuer.pem" -CAkey "$issuer.key" \
    -CAcreateserial -out "$name.pem" -extfile "$name.ext" "$@"
  rm -f "$name.csr" "$name.ext"
}

ca ca "idem test CA"
ca other-ca "idem other CA"
leaf server ca "DNS:localhost,IP:127.0.0.1,IP:::1" -days 2
leaf wrong-host ca "DNS:example.invalid" -days 2
leaf other other-ca "DNS:localhost,IP:127.0.0.1" -days 2
leaf client ca "" -days 2
rm -f ./*.srl
chmod 644 ./*.pem
