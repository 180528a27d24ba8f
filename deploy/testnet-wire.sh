#!/bin/sh
# Wires one node of the compose testnet, beside its running node: publishes this node's id,
# actor id and actor key in the shared directory HERO_TESTNET_DIR, waits for those of every
# peer named in HERO_PEERS, then registers each peer (dialled at ws://<name>:<port>), its actor,
# and context 1 with every actor of the testnet as executor. Idempotent: a restart redoes it.
set -eu
dir="$HERO_TESTNET_DIR"
me="${HERO_NODE_NAME:?}"
port="${HERO_NODE_PORT:-7700}"
home="${HERO_NODE_HOME:-/var/lib/hero-node}"
actor="${HERO_ACTOR_ID:-1}"

# peer list needs a running node and answers whatever the links do
until hero-node peer list >/dev/null 2>&1; do sleep 1; done
hero-node id >"$dir/.$me.id" && mv "$dir/.$me.id" "$dir/$me.id"
echo "$actor" >"$dir/.$me.actorid" && mv "$dir/.$me.actorid" "$dir/$me.actorid"
hero-verify pubkey "$home/actor.key" >"$dir/.$me.actor" && mv "$dir/.$me.actor" "$dir/$me.actor"

executors="--executor $actor"
for peer in ${HERO_PEERS:-}; do
    until [ -s "$dir/$peer.id" ] && [ -s "$dir/$peer.actor" ] && [ -s "$dir/$peer.actorid" ]; do
        sleep 1
    done
    peer_actor="$(cat "$dir/$peer.actorid")"
    hero-node peer add "$(cat "$dir/$peer.id")" "ws://$peer:$port" --name "$peer"
    hero-node actor add --id "$peer_actor" --pubkey "$(cat "$dir/$peer.actor")"
    executors="$executors --executor $peer_actor"
done
# shellcheck disable=SC2086 # one word per option
hero-node context add 1 --admin "$actor" $executors
echo "testnet: $me wired to ${HERO_PEERS:-no peers}"
