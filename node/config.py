"""The node's one frozen configuration, read from ``<home>/config.toml``.

Layout of a node's home directory (``hero-node init`` creates it):

    config.toml   this configuration
    node.key      the node's Ed25519 key (mode 0600); its public key is the node id
    actor.key     a default actor key for the CLI (mode 0600)
    valkey/       data and AOF of the embedded Valkey
    secrets/      passwords of the embedded Valkey's ACL users, one file per role (0600)
    run/          runtime facts of the running node (node.json, valkey.sock); mode 0700
"""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from node.errors import ConfigError
from node.runners.commands import validate_commands, validate_groups

DEFAULT_RUNNERS = {"python": 4, "sh": 2}


def default_home() -> Path:
    return Path(os.environ.get("HERO_NODE_HOME", Path.home() / ".hero-node"))


@dataclass(frozen=True)
class NodeConfig:
    home: Path
    name: str = "node"
    listen_host: str = "127.0.0.1"
    listen_port: int = 7700
    redis_url: str = ""  # empty: start an embedded Valkey
    valkey_port: int = 0  # 0: the embedded Valkey listens on run/valkey.sock only (no TCP)
    valkey_host: str = "127.0.0.1"  # where it listens when valkey_port is set
    valkey_databases: int = 256
    actor_id: int = 1  # the default actor of this home (actor.key)
    context_id: int = 1  # the default context the node creates for that actor
    runners: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_RUNNERS))
    # script type -> command template for types beyond the built-ins (node/runners/commands.py)
    commands: dict[str, list[str]] = field(default_factory=dict)
    # script type -> runner group of this node's slots (targeted queues, node/runners/queues.py)
    runner_groups: dict[str, str] = field(default_factory=dict)
    max_frame_bytes: int = 4 * 1024 * 1024
    handshake_timeout_s: float = 10.0
    reply_ttl_s: int = 86_400
    flow_deadline_s: int = 3600  # a flow whose document sets no deadline_s ends by then
    max_age_s: int = 300  # messages older than this are refused ("expired")
    max_skew_s: int = 60  # ... and dated further ahead than this ("from_future")
    max_output_bytes: int = 1024 * 1024
    # admission: a message (its stored hash) or one job's script above these is refused
    # ("oversize") on every path, local or from a peer, before its signature is checked
    max_message_bytes: int = 1024 * 1024
    max_script_bytes: int = 1024 * 1024
    grace_s: float = 10.0
    tls: bool = False  # listen on wss:// (self-signed tls.crt/tls.key in the home)
    python_workers: bool = True  # python jobs run in warm worker processes (else: spawn per job)
    lease_ttl_ms: int = 15_000  # a runner's lease on the job it runs; renewed every third

    @property
    def node_key_path(self) -> Path:
        return self.home / "node.key"

    @property
    def actor_key_path(self) -> Path:
        return self.home / "actor.key"

    @property
    def valkey_dir(self) -> Path:
        return self.home / "valkey"

    @property
    def run_dir(self) -> Path:
        return self.home / "run"

    @property
    def config_path(self) -> Path:
        return self.home / "config.toml"


_INT_FIELDS = (
    "listen_port",
    "valkey_port",
    "valkey_databases",
    "actor_id",
    "context_id",
    "max_frame_bytes",
    "reply_ttl_s",
    "flow_deadline_s",
    "max_age_s",
    "max_skew_s",
    "max_output_bytes",
    "lease_ttl_ms",
    "max_message_bytes",
    "max_script_bytes",
)
_FLOAT_FIELDS = ("handshake_timeout_s", "grace_s")
_STR_FIELDS = ("name", "listen_host", "redis_url", "valkey_host")
_BOOL_FIELDS = ("tls", "python_workers")


def load_config(home: Path) -> NodeConfig:
    """Read ``home/config.toml``; ConfigError says what is missing or wrong and how to fix it."""
    path = home / "config.toml"
    if not path.exists():
        raise ConfigError(
            f"no node configuration at {path}; create one with: hero-node init --home {home}"
        )
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    section = raw.get("node", {})
    values: dict[str, object] = {}
    for name in _INT_FIELDS + _FLOAT_FIELDS + _STR_FIELDS + _BOOL_FIELDS:
        if name not in section:
            continue
        value = section[name]
        ok = (
            isinstance(value, int) and not isinstance(value, bool)
            if name in _INT_FIELDS
            else isinstance(value, int | float)
            if name in _FLOAT_FIELDS
            else isinstance(value, bool)
            if name in _BOOL_FIELDS
            else isinstance(value, str)
        )
        if not ok:
            raise ConfigError(f"{path}: [node] {name} has the wrong type ({value!r})")
        values[name] = value
    runners = raw.get("runners", DEFAULT_RUNNERS)
    if not isinstance(runners, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in runners.values()
    ):
        raise ConfigError(
            f"{path}: [runners] maps a script type to a concurrency >= 0 "
            "(0: no local runner; external runners serve the type)"
        )
    unknown = set(section) - set(_INT_FIELDS + _FLOAT_FIELDS + _STR_FIELDS + _BOOL_FIELDS)
    if unknown:
        raise ConfigError(f"{path}: unknown [node] setting(s): {', '.join(sorted(unknown))}")
    try:
        commands = validate_commands(raw.get("commands", {}), runners)
        groups = validate_groups(raw.get("runner_groups", {}), runners)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return NodeConfig(
        home=home,
        runners=dict(runners),
        commands=commands,
        runner_groups=groups,
        **values,  # type: ignore[arg-type]
    )


def render_config(cfg: NodeConfig) -> str:
    """The TOML text ``hero-node init`` writes, with comments explaining each setting."""
    runners = "\n".join(f"{k} = {v}" for k, v in cfg.runners.items())
    commands = "\n".join(f"{k} = {json.dumps(v)}" for k, v in cfg.commands.items())
    groups = "\n".join(f"{k} = {json.dumps(v)}" for k, v in cfg.runner_groups.items())
    return f"""\
# hero-node configuration (see `hero-node --help`)
[node]
name = "{cfg.name}"
# websocket listener for links from peer nodes
listen_host = "{cfg.listen_host}"
listen_port = {cfg.listen_port}
# serve wss:// with a self-signed certificate (peers authenticate by node key, and the
# handshake binds the certificate, so no CA is involved); peers dial wss://host:port
tls = {"true" if cfg.tls else "false"}
# Redis/Valkey URL; leave empty to run an embedded Valkey (data in valkey/, AOF everysec).
# A Redis of your own needs ACL users and the default user off (README: "Who may write the
# node's Valkey"); the URL then names the node's user and password
redis_url = "{cfg.redis_url}"
# the embedded Valkey listens on the unix socket run/valkey.sock (only this user may connect;
# every role authenticates with its password in secrets/). A port (not 0) opens TCP too, on
# valkey_host, for external runners on other machines: `hero-node runner credentials`
valkey_port = {cfg.valkey_port}
valkey_host = "{cfg.valkey_host}"
valkey_databases = {cfg.valkey_databases}
# the actor of actor.key and the context the node creates for it on first start
actor_id = {cfg.actor_id}
context_id = {cfg.context_id}
max_frame_bytes = {cfg.max_frame_bytes}
handshake_timeout_s = {cfg.handshake_timeout_s}
reply_ttl_s = {cfg.reply_ttl_s}
# a flow not over this long after its creation ends in error (flow_deadline), its unfinished
# jobs too, unless its signed document sets its own deadline_s
flow_deadline_s = {cfg.flow_deadline_s}
# freshness: refuse messages older than max_age_s or dated more than max_skew_s ahead;
# keys and nonces of accepted messages are remembered for that window (replay protection)
max_age_s = {cfg.max_age_s}
max_skew_s = {cfg.max_skew_s}
max_output_bytes = {cfg.max_output_bytes}
# a message (its stored fields) or a job's script larger than this is refused ("oversize")
max_message_bytes = {cfg.max_message_bytes}
max_script_bytes = {cfg.max_script_bytes}
# on SIGTERM/SIGINT, running jobs get this long to finish
grace_s = {cfg.grace_s}

# python jobs run in warm worker processes (one per slot, recycled every 500 jobs, killed on
# timeout); false: one fresh interpreter per job
python_workers = {"true" if cfg.python_workers else "false"}

# concurrency of the runners per context, by script type (python and sh are built in;
# other types need a command below)
[runners]
{runners}

# commands of other script types: a non-empty list of strings; placeholders {{script_file}}
# (the script in a 0600 temp file, removed after the job; else the script is on stdin),
# {{job_id}}, {{caller_id}}, {{context_id}}, {{script_type}}. Example:
#   v = ["v", "run", "{{script_file}}"]
[commands]
{commands}

# optional: the group of this node's slots of a type; slot i then consumes
# queue:<type>:group:<g>:inst:<i>, then queue:<type>:group:<g>, then queue:<type>
[runner_groups]
{groups}
"""
