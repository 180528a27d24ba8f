#!/bin/sh
# Container entrypoint: on the first start, create the home in the volume (listening on every
# interface, since the container's network is the boundary), optionally wire the testnet in
# the background, then run the command (hero-node run) as the container's main process.
set -eu
home="${HERO_NODE_HOME:-/var/lib/hero-node}"
if [ ! -f "$home/config.toml" ]; then
    hero-node init --name "${HERO_NODE_NAME:-node}" --listen-port "${HERO_NODE_PORT:-7700}" \
        --actor-id "${HERO_ACTOR_ID:-1}"
    sed -i 's/^listen_host = .*/listen_host = "0.0.0.0"/' "$home/config.toml"
fi
if [ -n "${HERO_TESTNET_DIR:-}" ]; then
    hero-node-testnet-wire &
fi
exec "$@"
