#!/usr/bin/env bash
# make-test-ca.sh: a throw-away certificate authority, a Mosquitto server certificate
# and optional client certificates, FOR TESTS AND LABS ONLY.
#
#   WARNING: the CA key is written unencrypted next to the certificates, the CA can
#   sign anything, and nothing here supports revocation. Do not use these files on a
#   network you care about: use your organisation's PKI (or an ACME certificate for
#   the broker's public name) in production. See docs/operating.md, "TLS".
#
# Usage:
#   deploy/tls/make-test-ca.sh [options] OUT_DIR
#
# Options:
#   --server-name NAME   extra DNS name for the server certificate (repeatable);
#                        localhost and 127.0.0.1 are always included (as DNS and IP
#                        subject alternative names), e.g. --server-name mosquitto
#                        for the compose file's aggregator
#   --server-ip ADDR     extra IP address for the server certificate (repeatable)
#   --client ID          also make client-ID.crt/.key (CN=ID) for mutual TLS
#                        (repeatable; ID as in add-agent.sh)
#   --days N             validity in days (default 30: test certificates should die)
#   --group GROUP        make OUT_DIR (0750) and server.key (0640) readable by GROUP,
#                        the broker's group: Mosquitto reads its key after it has
#                        dropped root, as user mosquitto. Default: mosquitto when run
#                        as root and that group exists; otherwise none (0700/0600:
#                        readable only by you, which suits a broker you run yourself)
#   --force              overwrite existing files in OUT_DIR
#   -h, --help           this text
#
# Writes into OUT_DIR (created with mode 0700; never inside the cat-edge repository):
#   ca.crt ca.key server.crt server.key [client-ID.crt client-ID.key ...]
# Keys are ECDSA P-256, mode 0600 (server.key 0640 with a group). Needs: openssl
# (1.1.1 or 3.x).
#
# Exit status: 0 done, 2 a usage error (a bad option or argument), 1 any other failure.
set -euo pipefail

readonly ID_RE='^[A-Za-z0-9._-]{1,64}$'

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
}

die() {
    echo "make-test-ca.sh: $*" >&2
    exit 1
}

# A usage error (a bad option or argument): exit 2, as argparse and the CLIs do.
usage_error() {
    echo "make-test-ca.sh: $*" >&2
    exit 2
}

server_names=()
server_ips=()
clients=()
days=30
force=0
out_dir=""
group=""

while (($# > 0)); do
    case "$1" in
        --server-name)
            [[ $# -ge 2 && -n "$2" ]] || usage_error "--server-name needs a DNS name"
            [[ "$2" =~ ^[A-Za-z0-9.-]+$ ]] || usage_error "--server-name: not a DNS name: $2"
            server_names+=("$2")
            shift 2
            ;;
        --server-ip)
            [[ $# -ge 2 && -n "$2" ]] || usage_error "--server-ip needs an IP address"
            [[ "$2" =~ ^[0-9A-Fa-f.:]+$ ]] || usage_error "--server-ip: not an IP address: $2"
            server_ips+=("$2")
            shift 2
            ;;
        --client)
            [[ $# -ge 2 ]] || usage_error "--client needs an agent id"
            [[ "$2" =~ $ID_RE ]] || usage_error "--client: invalid id '$2' (1..64 of A-Z a-z 0-9 . _ -)"
            clients+=("$2")
            shift 2
            ;;
        --days)
            [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || usage_error "--days needs a positive integer"
            days="$2"
            shift 2
            ;;
        --group)
            [[ $# -ge 2 && -n "$2" ]] || usage_error "--group needs a group name"
            getent group "$2" >/dev/null 2>&1 || usage_error "--group: no group '$2' on this host"
            group="$2"
            shift 2
            ;;
        --force)
            force=1
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        -*)
            usage_error "unknown option $1 (see --help)"
            ;;
        *)
            [[ -z "$out_dir" ]] || usage_error "only one OUT_DIR, got '$out_dir' and '$1'"
            out_dir="$1"
            shift
            ;;
    esac
done

[[ -n "$out_dir" ]] || usage_error "missing OUT_DIR (see --help)"
command -v openssl >/dev/null 2>&1 || die "openssl not found; install it (apt-get install openssl)"

# Refuse to write keys into the repository this script lives in: a committed CA key
# would let anyone mint "trusted" brokers for every deployment that used it.
out_dir="$(realpath -m -- "$out_dir")"
repo_root="$(realpath -- "$(dirname -- "${BASH_SOURCE[0]}")/../..")"
case "$out_dir/" in
    "$repo_root"/*) die "refusing to write keys inside the repository ($repo_root); pick a directory outside it, e.g. \$HOME/cat-edge-test-tls" ;;
esac
mkdir -p -- "$out_dir"
chmod 0700 "$out_dir"

if ((force == 0)); then
    for f in ca.key ca.crt server.key server.crt; do
        [[ ! -e "$out_dir/$f" ]] || die "$out_dir/$f exists; use --force to overwrite"
    done
fi

umask 077
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

new_key() {
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
    chmod 0600 "$1"
}

# --- CA --------------------------------------------------------------------------
new_key "$out_dir/ca.key"
cat >"$work/ca.ext" <<'EOF'
basicConstraints = critical, CA:true, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
openssl req -new -key "$out_dir/ca.key" -subj "/O=cat-edge TEST/CN=cat-edge TEST CA (do not trust)" \
    -out "$work/ca.csr"
openssl x509 -req -in "$work/ca.csr" -signkey "$out_dir/ca.key" -days "$days" \
    -extfile "$work/ca.ext" -sha256 -out "$out_dir/ca.crt" 2>/dev/null

# sign CSR CN EXTFILE OUT
sign() {
    openssl x509 -req -in "$1" -CA "$out_dir/ca.crt" -CAkey "$out_dir/ca.key" \
        -CAcreateserial -CAserial "$work/ca.srl" -days "$days" -sha256 \
        -extfile "$2" -out "$3" 2>/dev/null
}

# --- server ------------------------------------------------------------------------
# Clients check the host name against the subjectAltName only (the CN is ignored by
# Python's ssl module and by modern TLS stacks), so every name and IP goes there.
san="DNS:localhost,IP:127.0.0.1,IP:::1"
for name in "${server_names[@]+"${server_names[@]}"}"; do san+=",DNS:$name"; done
for ip in "${server_ips[@]+"${server_ips[@]}"}"; do san+=",IP:$ip"; done
cat >"$work/server.ext" <<EOF
basicConstraints = critical, CA:false
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = $san
EOF
new_key "$out_dir/server.key"
openssl req -new -key "$out_dir/server.key" -subj "/O=cat-edge TEST/CN=localhost" \
    -out "$work/server.csr"
sign "$work/server.csr" "$work/server.ext" "$out_dir/server.crt"

# --- clients -----------------------------------------------------------------------
cat >"$work/client.ext" <<'EOF'
basicConstraints = critical, CA:false
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
EOF
for id in "${clients[@]+"${clients[@]}"}"; do
    new_key "$out_dir/client-$id.key"
    openssl req -new -key "$out_dir/client-$id.key" -subj "/O=cat-edge TEST/CN=$id" \
        -out "$work/client.csr"
    sign "$work/client.csr" "$work/client.ext" "$out_dir/client-$id.crt"
done

chmod 0644 "$out_dir"/*.crt
if [[ -z "$group" ]] && ((EUID == 0)) && getent group mosquitto >/dev/null 2>&1; then
    group=mosquitto
fi
if [[ -n "$group" ]]; then
    chgrp "$group" "$out_dir" "$out_dir/server.key" \
        || die "cannot give $out_dir and server.key to group $group (be root or a member)"
    chmod 0750 "$out_dir"
    chmod 0640 "$out_dir/server.key"
    echo "make-test-ca.sh: $out_dir (0750) and server.key (0640) readable by group $group" >&2
else
    echo "make-test-ca.sh: keys readable by you only; for a system Mosquitto pass --group mosquitto (or run as root)" >&2
fi
echo "make-test-ca.sh: TEST certificates in $out_dir (valid $days days; SAN $san)" >&2
echo "make-test-ca.sh: WARNING: for tests only; ca.key is unencrypted and can sign anything" >&2
