#!/bin/sh
# First step of deploy/compose-replicated.yaml: create the node's home (it names the three
# Sentinels in [store]) and, from its passwords, what every server of the replicated store
# needs: the ACL file of the data servers, their configuration (persistence, the replica's
# credentials, min-replicas-to-write) and the Sentinels' (docs/operate/replicated-store.md).
# Idempotent: a restart keeps the home and rewrites the same files.
set -eu
home="${HERO_NODE_HOME:-/var/lib/hero-node}"
store="${HERO_STORE_DIR:-/var/lib/hero-store}"
if [ ! -f "$home/config.toml" ]; then
    hero-node init --name "${HERO_NODE_NAME:-node}" --listen-port "${HERO_NODE_PORT:-7700}" \
        --actor-id "${HERO_ACTOR_ID:-1}" \
        --sentinel sentinel1:26379 --sentinel sentinel2:26379 --sentinel sentinel3:26379
    sed -i 's/^listen_host = .*/listen_host = "0.0.0.0"/' "$home/config.toml"
fi
hero-node store-acl data >"$store/.data.acl"
{
    echo "port 6379"
    echo "bind 0.0.0.0"
    echo "protected-mode no"
    echo "databases 256"
    echo "aclfile $store/data.acl"
    echo "appendonly yes"
    echo "appendfsync always"
    echo "min-replicas-to-write 1"
    echo "min-replicas-max-lag 10"
    echo "hash-max-listpack-value 1024"
    hero-node store-acl replica
} >"$store/.data.conf"
{
    echo "port 26379"
    echo "sentinel resolve-hostnames yes"
    echo "sentinel announce-hostnames yes"
    echo "sentinel monitor hero valkey1 6379 2"
    echo "sentinel down-after-milliseconds hero 5000"
    echo "sentinel failover-timeout hero 30000"
    echo "sentinel parallel-syncs hero 1"
    hero-node store-acl sentinel
} >"$store/.sentinel.conf"
chmod 0600 "$store/.data.acl" "$store/.data.conf" "$store/.sentinel.conf"
mv "$store/.data.acl" "$store/data.acl"
mv "$store/.data.conf" "$store/data.conf"
mv "$store/.sentinel.conf" "$store/sentinel.conf"
echo "store-init: home $home, store files in $store"
