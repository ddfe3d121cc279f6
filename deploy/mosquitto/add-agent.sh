#!/usr/bin/env bash
# add-agent.sh: add (or re-key) one MQTT user in the broker's password file and write
# its freshly generated password to a secret file for the device.
#
# Usage:
#   deploy/mosquitto/add-agent.sh [options] AGENT_ID
#   deploy/mosquitto/add-agent.sh [options] --aggregator
#   deploy/mosquitto/add-agent.sh [options] --bridge SITE
#
# Options:
#   -f, --password-file PATH  Mosquitto password file (default
#                             /etc/mosquitto/cat-edge/passwd; created if missing)
#   -o, --secret-out PATH     where to write the generated password (default
#                             ./AGENT_ID.mqtt-password, mode 0600; never overwritten)
#       --aggregator          create the `aggregator` user (reserved: the ACL gives
#                             it the aggregator's rights, so no device may have it)
#       --bridge SITE         create user `bridge-SITE` on the CENTRAL broker: the
#                             remote_username of site SITE's bridge (deploy/mosquitto/
#                             site.conf; its ACL block in deploy/mosquitto/acl). Names
#                             starting with `bridge-` are reserved for bridges
#   -h, --help                this text
#
# The user name IS the agent id: the ACL (deploy/mosquitto/acl) lets user pi-01 write
# only cat/<job>/{hello,update,status,request}/pi-01, so run the agent with
# `--agent-id pi-01 --username pi-01`. Running this again for an existing user
# replaces its password (rotation). Afterwards:
#   1. copy the secret file to the device as /etc/cat-edge/mqtt-password
#      (owner root, group cat-edge, mode 0640), then delete your copy;
#   2. reload the broker so it re-reads the password file:
#      systemctl reload mosquitto   (or: kill -HUP <mosquitto pid>)
# Removing a user: mosquitto_passwd -D PASSWORD_FILE AGENT_ID, then reload.
#
# The password never appears on a command line (mosquitto_passwd reads it on stdin).
#
# Exit status: 0 done, 2 a usage error (a bad option or argument), 1 any other failure.
set -euo pipefail

readonly ID_RE='^[A-Za-z0-9._-]{1,64}$'
readonly RESERVED="aggregator"
readonly BRIDGE_PREFIX="bridge-"

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
}

die() {
    echo "add-agent.sh: $*" >&2
    exit 1
}

# A usage error (a bad option or argument): exit 2, as argparse and the CLIs do.
usage_error() {
    echo "add-agent.sh: $*" >&2
    exit 2
}

password_file="/etc/mosquitto/cat-edge/passwd"
secret_out=""
user=""
aggregator=0
bridge=""

while (($# > 0)); do
    case "$1" in
        -f | --password-file)
            [[ $# -ge 2 && -n "$2" ]] || usage_error "$1 needs a path"
            password_file="$2"
            shift 2
            ;;
        -o | --secret-out)
            [[ $# -ge 2 && -n "$2" ]] || usage_error "$1 needs a path"
            secret_out="$2"
            shift 2
            ;;
        --aggregator)
            aggregator=1
            shift
            ;;
        --bridge)
            [[ $# -ge 2 && -n "$2" ]] || die "$1 needs a site name"
            bridge="$2"
            shift 2
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        -*)
            usage_error "unknown option $1 (see --help)"
            ;;
        *)
            [[ -z "$user" ]] || usage_error "only one AGENT_ID, got '$user' and '$1'"
            user="$1"
            shift
            ;;
    esac
done

if ((aggregator)) && [[ -n "$bridge" ]]; then
    usage_error "give --aggregator or --bridge, not both"
elif ((aggregator)); then
    [[ -z "$user" || "$user" == "$RESERVED" ]] || usage_error "--aggregator creates user '$RESERVED'; do not give an AGENT_ID"
    user="$RESERVED"
elif [[ -n "$bridge" ]]; then
    [[ -z "$user" ]] || usage_error "--bridge creates user '$BRIDGE_PREFIX$bridge'; do not give an AGENT_ID"
    user="$BRIDGE_PREFIX$bridge"
    [[ "$user" =~ $ID_RE ]] || usage_error "invalid site name '$bridge': '$user' must be 1 to 64 characters from A-Z a-z 0-9 . _ -"
else
    [[ -n "$user" ]] || usage_error "missing AGENT_ID (see --help)"
    [[ "$user" =~ $ID_RE ]] || usage_error "invalid agent id '$user': use 1 to 64 characters from A-Z a-z 0-9 . _ -"
    [[ "$user" != "$RESERVED" ]] || usage_error "'$RESERVED' is reserved for the aggregator; use --aggregator to create it"
    [[ "$user" != "$BRIDGE_PREFIX"* ]] || usage_error "'$user': names starting with '$BRIDGE_PREFIX' are reserved for site bridges; use --bridge SITE"
fi

passwd_bin="$(PATH="$PATH:/usr/sbin:/usr/local/sbin" command -v mosquitto_passwd || true)"
[[ -n "$passwd_bin" ]] || die "mosquitto_passwd not found; install Mosquitto (apt-get install mosquitto)"
command -v openssl >/dev/null 2>&1 || die "openssl not found (needed to generate the password)"

secret_out="${secret_out:-./$user.mqtt-password}"
[[ ! -e "$secret_out" ]] || die "$secret_out exists; move it away or pass --secret-out"
repo_root="$(realpath -- "$(dirname -- "${BASH_SOURCE[0]}")/../..")"
case "$(realpath -m -- "$secret_out")/" in
    "$repo_root"/*) die "refusing to write a password inside the repository ($repo_root); use --secret-out" ;;
esac

# 32 random bytes, URL-safe base64 without padding: 43 characters, no quoting issues.
password="$(openssl rand -base64 32 | tr -d '\n=' | tr '+/' '-_')"

umask 077
create=()
[[ -e "$password_file" ]] || create=(-c)
if ! printf '%s\n%s\n' "$password" "$password" \
    | "$passwd_bin" "${create[@]+"${create[@]}"}" "$password_file" "$user" >/dev/null; then
    die "mosquitto_passwd failed for $password_file (is it writable?)"
fi
# The broker re-reads this file on SIGHUP after it has dropped root, as user mosquitto.
if ((EUID == 0)) && getent group mosquitto >/dev/null 2>&1; then
    chgrp mosquitto "$password_file"
    chmod 0640 "$password_file"
else
    echo "add-agent.sh: make $password_file readable by the broker's user (root:mosquitto 0640)" >&2
fi
printf '%s\n' "$password" >"$secret_out"
chmod 0600 "$secret_out"

echo "add-agent.sh: user '$user' set in $password_file; password written to $secret_out" >&2
echo "add-agent.sh: next: copy it to the device (see --help), delete this copy, reload mosquitto" >&2
