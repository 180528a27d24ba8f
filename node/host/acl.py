"""Who may do what on the node's own Valkey: one ACL user per role, passwords in the home.

The embedded Valkey holds what the node trusts (actors' public keys, contexts' admins and
executors, peers): whoever may write ``actor:*`` may run jobs as any actor. So nothing connects
without a password, and each role may touch only what it needs:

- ``node``: every key and command (the daemon and the ``hero-node`` commands of its operator);
- ``client``: submit (``message:*``, ``msg_out``), flows (``flow:*``, ``flow_events``, ...), wait
  for replies (``reply:*``, ``inbox:*``, ``flow_progress:*``) and read jobs, logs and the
  registry; never write ``actor:*``, ``context:*``, ``peer:*``, ``node:*`` or a job;
- ``runner``: the node's own runner processes (node/worker/), and external runners (docs/use/
  runners.md): queues, jobs, ``running`` (their leases), ``results``, in-flight lists, presence
  and runner hashes, and what ending an attempt writes (attempts, the answer or the reply, the
  dlq, live logs, the type breakers, delayed retries); never ``actor:*``, ``context:*``,
  ``peer:*``, ``node:*``, flows, replay markers or any other key.

Each password is a file ``secrets/valkey-<role>`` (mode 0600, directory 0700) of the home, made
by ``hero-node init`` (or at the next start of a home made before); Valkey gets only their
SHA-256 in an ACL file, and the ``default`` user is off.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING

from bus.core.urls import with_credentials
from node.errors import NodeError

if TYPE_CHECKING:
    from node.config import NodeConfig
    from node.host.valkey import ValkeySpec

log = logging.getLogger(__name__)

NODE, CLIENT, RUNNER = "node", "client", "runner"
ROLES = (NODE, CLIENT, RUNNER)

# Commands every role needs to connect (a client sends HELLO 3 AUTH, CLIENT SETINFO, SELECT) and to
# run a MULTI/EXEC transaction (the commands queued inside are checked one by one).
# ROLE: a client that found its primary through Sentinels checks it is one (bus/store/failover.py).
_CONNECT = "+hello +auth +ping +select +client|setinfo +client|setname +multi +exec +discard +role"

# Selectors: each pairs commands with the keys they may touch, so that, say, LPUSH on msg_out
# does not also allow BLPOP (stealing) on it. A command is allowed if one selector allows it.
_CLIENT_SELECTORS = (
    "+hget +hgetall +hmget +exists %R~job:* %R~message:* %R~flow:* %R~node:info %R~peer:*",
    "+smembers %R~peers",
    "+lrange +lpos +llen %R~msg_out %R~inflight:supervisor %R~outbox:*",
    "+xread +xrange %R~logs:*",
    "+hset ~message:* ~flow:*",
    "+lpush ~msg_out ~flow_events",
    "+sadd ~flows:active",
    "+blpop ~reply:* ~flow_progress:*",
    "+blmpop ~inbox:*",
    # a submit waits for its own write to be durable (WAITAOF on that write's connection,
    # bus/store/durable.py): no barrier key to write
    "+waitaof",
)

# A script's keys must match a selector that allows EVAL/EVALSHA; each redis.call inside it is
# checked again on its own. SCRIPT LOAD: a client library loads a script it runs by its hash.
# WAITAOF: on a replicated store a runner confirms a start before it runs the job
# (bus/store/atomic/runs_sync.py SyncRuns.confirm).
_RUNNER_CONNECT = f"{_CONNECT} +script|load +time +waitaof"
_RUNNER_SELECTORS = (
    "+type +exists +hset +hsetnx +hget +hgetall +hmget +hincrby +hdel ~job:*",
    "+type +blmove +lmove +lmpop +lrange +llen +lrem +lpush +rpush ~queue:* ~inflight:runner:*",
    # a batch's ends rewrite their slot's in-flight list at once (lua/runs_inflight.lua)
    "+del ~inflight:runner:*",
    # the started jobs, each scored with its lease's expiry (bus/core/keys.py RUNNING)
    "+zadd +zrem +zscore +zrange ~running",
    "+lpush ~results",
    "+hset +hgetall +del ~runner:*",
    "+set +get +expire +del ~presence:runner:*",
    # the job statistics and the type breakers the runs_* scripts keep
    # (bus/store/atomic/lua/stats_jobs.lua, type_breaker.lua)
    "+hincrby +hincrbyfloat +hset +hget ~stats:jobs",
    "+hget +hmget +hset ~type_breakers",
    # a started job leaves its actor's queue depth, and wakes the fair share while actors wait
    # (bus/store/atomic/lua/quota_depth.lua quota_left)
    "+srem +hincrby +scard +lpush +ltrim ~quota:*",
    # ending an attempt: its history, the answer (a result message on msg_out) or the local
    # client's reply and its flow's event, a retry's due time, a refusal's dead letter
    "+rpush +lrange ~attempts:*",
    "+hset +hget +hgetall ~message:*",
    "+lpush +expire ~reply:* ~inbox:*",
    "+lpush ~msg_out ~flow_events ~dlq ~dlq_events",
    "+zadd ~delayed",
    "+xadd +expire ~logs:*",
    "+eval +evalsha ~job:* ~running ~results ~queue:* ~inflight:runner:* ~attempts:*"
    " ~message:* ~reply:* ~inbox:* ~msg_out ~flow_events ~delayed ~type_breakers",
)


def secrets_dir(home: Path) -> Path:
    return home / "secrets"


def secret_path(home: Path, role: str) -> Path:
    return secrets_dir(home) / f"valkey-{role}"


def ensure_secrets(home: Path, roles: tuple[str, ...] = ROLES) -> dict[str, str]:
    """Every role's password, generating (0600, in a 0700 directory) those the home lacks
    (``roles``: a replicated store has two more, node/host/replicated.py)."""
    folder = secrets_dir(home)
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)
    made = [r for r in roles if not secret_path(home, r).exists()]
    for role in made:
        _write_private(secret_path(home, role), secrets.token_urlsafe(32) + "\n")
    if made:
        log.info("generated Valkey password(s) for %s in %s", ", ".join(made), folder)
    return {role: read_secret(home, role) for role in roles}


def read_secret(home: Path, role: str) -> str:
    """The password of ``role``; NodeError naming the file if it is missing or unreadable."""
    path = secret_path(home, role)
    try:
        password = path.read_text().strip()
    except OSError as exc:
        raise NodeError(
            f"cannot read the Valkey password of role {role!r} ({path}: {exc.strerror}); "
            "it is made by hero-node init and at the node's start"
        ) from None
    if not password:
        raise NodeError(f"{path} is empty; delete it and restart the node to make a new one")
    return password


def acl_text(passwords: dict[str, str]) -> str:
    """The ACL file: the default user off, one user per role (only password hashes)."""

    def user(role: str, rules: str) -> str:
        digest = hashlib.sha256(passwords[role].encode()).hexdigest()
        return f"user {role} on #{digest} resetchannels resetkeys {rules}"

    def selectors(items: tuple[str, ...]) -> str:
        return " ".join(f"({s})" for s in items)

    lines = [
        "user default off resetchannels resetkeys -@all",
        user(NODE, "~* &* +@all"),
        user(CLIENT, f"-@all {_CONNECT} {selectors(_CLIENT_SELECTORS)}"),
        user(RUNNER, f"-@all {_RUNNER_CONNECT} {selectors(_RUNNER_SELECTORS)}"),
    ]
    return "\n".join(lines) + "\n"


def write_acl_file(path: Path, passwords: dict[str, str]) -> None:
    _write_private(path, acl_text(passwords))


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte (then rename into place)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def embedded_spec(config: NodeConfig) -> ValkeySpec:
    """The embedded Valkey of ``config``'s home, ready to start: ``run/`` (0700, for its socket)
    exists, every role has a password and the ACL file says what each may do. Generates the
    passwords a home made before them lacks (a log line says so)."""
    # imported on use: hero-node's parser takes CLIENT and RUNNER from this module, and
    # valkey.py's trio would slow its --help and every TAB of its shell completion
    from node.host.valkey import ValkeySpec, maxmemory_bytes

    run_dir = config.run_dir
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    run_dir.chmod(0o700)
    passwords = ensure_secrets(config.home)
    aclfile = secrets_dir(config.home) / "valkey.acl"
    write_acl_file(aclfile, passwords)
    return ValkeySpec(
        port=config.valkey_port,
        bind=config.valkey_host,
        data_dir=config.valkey_dir,
        databases=config.valkey_databases,
        unix_socket=valkey_socket(config),
        maxmemory=str(maxmemory_bytes(config)),
        aclfile=aclfile,
        auth=(NODE, passwords[NODE]),
    )


def valkey_socket(config: NodeConfig) -> Path:
    return config.run_dir / "valkey.sock"


def reachable_url(config: NodeConfig) -> str:
    """The embedded Valkey's URL (no credentials) for those who may not share the node's
    machine: TCP when the config opens a port, else the unix socket."""
    if config.valkey_port:
        return f"redis://{config.valkey_host}:{config.valkey_port}"
    return f"unix://{valkey_socket(config)}"


def role_url(config: NodeConfig, published: str, role: str = NODE) -> str:
    """The URL ``role`` connects with: for the node's own tools with a configured Redis, that
    URL as is; else the embedded Valkey's ``published`` URL (run/node.json, the ready line)
    with the role's password from the home. A replicated store (``[store]``): the
    ``redis+sentinel://`` URL of its Sentinels, whatever ``published`` says."""
    if config.store.replicated:
        return config.store.url(role, read_secret(config.home, role))
    if config.redis_url and role == NODE:
        return config.redis_url
    return with_credentials(published, role, read_secret(config.home, role))
