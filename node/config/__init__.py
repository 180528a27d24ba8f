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

import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import get_type_hints

import tomli_w

from bus.core.verify import AcceptedAlgorithms
from crypto import ALGORITHMS
from node.config.commands import validate_commands, validate_groups
from node.config.console import ConsoleConfig, parse_console, render_console
from node.config.store import StoreConfig, parse_store, render_store
from node.config.tracing import TracingConfig, parse_tracing, render_tracing
from node.errors import ConfigError
from node.sandbox.limits import LimitsError, parse_limits
from node.sandbox.plan import MODES
from node.sandbox.settings import SandboxSettingsError, parse_sandbox


def cores() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# A python slot is a warm interpreter running job code: CPU-bound work, as many at once as the
# node has cores (at most 8), as Celery's and Dramatiq's process counts default. More slots than
# cores keep no more jobs running; they split a stream of jobs into lone ones, each a wake-up of
# a runner and its sandbox where a batch would take several: on 2 cores, 4 slots cost ~16 % more
# CPU per job than 2 (bench/HISTORY.md#slots-per-core). Jobs that mostly wait (network, sleep)
# want more: ``[runners] python = N``.
MAX_DEFAULT_PYTHON_SLOTS = 8
DEFAULT_RUNNERS = {"python": min(cores(), MAX_DEFAULT_PYTHON_SLOTS), "sh": 2}


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
    # script type -> command template for types beyond the built-ins (node/slot/commands.py)
    commands: dict[str, list[str]] = field(default_factory=dict)
    # script type -> runner group of this node's slots (targeted queues, bus/core/queues.py)
    runner_groups: dict[str, str] = field(default_factory=dict)
    # context id (or "default") -> the actor key algorithms accepted there (accepted_algorithms)
    algorithms: dict[str, list[str]] = field(default_factory=dict)
    max_frame_bytes: int = 4 * 1024 * 1024
    handshake_timeout_s: float = 10.0
    max_pending_links: int = 256  # inbound connections not yet authenticated (bus/wire/gate.py)
    max_pending_links_per_address: int = 16
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
    # "tls": every link TLS 1.3, bound to the node keys (node/links/encryption.py); "none"
    link_encryption: str = "tls"
    python_workers: bool = True  # python jobs in the sandbox's warm worker (else: spawn)
    # queued python jobs a warm slot takes, runs and ends at once, at most (node/worker/batch.py)
    batch_jobs: int = 16
    # runner processes (and the job processes they start) this many nice steps below the node
    # (node/runners/processes.py): intake first, and slots that take what queued meanwhile
    runner_nice: int = 10
    lease_ttl_ms: int = 15_000  # a runner's lease on the job it runs; renewed every third
    # the [console] table: the web console (node/web/); off unless config.toml sets listen
    console: ConsoleConfig = field(default_factory=ConsoleConfig)
    # the [store] table: a replicated store behind Sentinels (node/config/store.py)
    store: StoreConfig = field(default_factory=StoreConfig)
    # the [tracing] table: OpenTelemetry spans over OTLP/HTTP (node/observe/tracing.py); off
    tracing: TracingConfig = field(default_factory=TracingConfig)
    # dead letters (node/observe/dlq.py): each dlq's bound (0: none), the oldest beyond it archived
    # to
    # archive/dlq-<db>.jsonl; a command run with each new entry as JSON on its stdin
    dlq_max_len: int = 10_000
    dlq_limits: dict[str, int] = field(default_factory=dict)  # context id -> its own bound
    on_dead_letter: str = ""
    on_dead_letter_timeout_s: float = 10.0
    # per-peer circuit breaker (bus/core/breaker.py): open after breaker_failures failed
    # dials or links in a row, for breaker_open_s, then breaker_probes dials at once
    breaker_failures: int = 5
    # 10 s: the transport's longest dial backoff, so an open breaker delays no reconnection
    # by more than the backoff would; a longer one fails more jobs fast, reconnects later
    breaker_open_s: float = 10.0
    breaker_probes: int = 1
    # per-script-type circuit breaker (bus/store/atomic/type_breakers.py): a type's runners stop
    # taking its jobs after type_breaker_failures failed attempts in a row (0: off), for
    # type_breaker_open_s, then let type_breaker_probes jobs through at once
    type_breaker_failures: int = 5
    type_breaker_open_s: float = 10.0
    type_breaker_probes: int = 1
    # docs/security/sandbox.md: auto, strict, namespaces or none
    isolation: str = "auto"
    job_uid_base: int = 2_000_000_000  # strict: context N's jobs run as uid/gid base + N
    # [limits] (node/sandbox/limits.py) and [sandbox] (node/sandbox/settings.py), TOML-shaped
    limits: dict[str, object] = field(default_factory=dict)
    sandbox: dict[str, object] = field(default_factory=dict)
    # queue bounds (node/intake/admission.py: queue_bounds): jobs queued and not started yet,
    # per actor in a context and per context (0: none); [queue_limits] per context
    max_queued_per_actor: int = 10_000
    max_queued_per_context: int = 100_000
    queue_limits: dict[str, dict[str, int]] = field(default_factory=dict)
    # fair share (node/intake/fair_share.py): an actor holds at most this many of its jobs in a
    # context's queues, the rest wait in its own list (0: off, one first-in-first-out queue).
    # 100: another actor's job waits behind at most 100 of a flooder's, not its 10,000; an
    # actor that holds fewer pays one LLEN per batch and nothing else
    fair_share_jobs: int = 100
    # a peer's link stores no more while this many of its messages wait in msg_in (0: none)
    max_msg_in_per_peer: int = 10_000
    # the node keeps room for itself (node/intake/pressure.py): below this much free disk
    # where its home or its Valkey data is, or with its store this close to maxmemory, it
    # takes no new jobs until there is room again; checked every pressure_check_s
    disk_headroom_mb: int = 1024
    store_max_memory_mb: int = 0  # the embedded Valkey's maxmemory; 0: half the machine's
    store_headroom_pct: int = 10
    pressure_check_s: float = 2.0
    # [node] settings of older versions found in config.toml, warned about at start
    legacy_settings: tuple[str, ...] = ()

    @cached_property
    def accepted_algorithms(self) -> AcceptedAlgorithms:
        """The key algorithms whose actors may sign messages in each context: its entry in
        ``[algorithms]``, else the ``default`` entry, else every algorithm (an actor's
        signatures are held to its registered key's algorithm anyway). Resolved once: the
        node asks for every message it judges, and the table cannot change while it runs."""
        default = tuple(self.algorithms.get("default") or ALGORITHMS)
        named = {int(c): tuple(a) for c, a in self.algorithms.items() if c != "default" and a}
        return AcceptedAlgorithms(default, named)

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

    @property
    def archive_dir(self) -> Path:
        return self.home / "archive"

    def dlq_limit(self, db: int) -> int:
        """The bound of DB ``db``'s dlq (0: none): its own in [dlq_limits], else dlq_max_len."""
        return self.dlq_limits.get(str(db), self.dlq_max_len)


# The [node] settings are the fields of NodeConfig with a scalar type, checked against it; a field
# with another type (the home, the tables below) is not a [node] setting.
_SCALAR_TYPES = (bool, int, float, str)
_HINTS = get_type_hints(NodeConfig)  # once: each call evaluates every field's annotation
_SETTINGS: dict[str, type] = {
    f.name: _HINTS[f.name] for f in fields(NodeConfig) if _HINTS[f.name] in _SCALAR_TYPES
}


# Lower bounds of [node] settings whose smaller values mean nothing (refused at load).
LOWER_BOUNDS: dict[str, float] = {
    "type_breaker_failures": 0,
    "type_breaker_open_s": 0.001,
    "type_breaker_probes": 1,
    "job_uid_base": 1000,
    "max_queued_per_actor": 0,
    "max_queued_per_context": 0,
    "fair_share_jobs": 0,
    "max_msg_in_per_peer": 0,
    "disk_headroom_mb": 0,
    "store_max_memory_mb": 0,
    "store_headroom_pct": 1,
    "pressure_check_s": 0.01,
    "batch_jobs": 1,
    "runner_nice": 0,
}


# Upper bounds of [node] settings whose larger values mean nothing (refused at load): at 100 the
# store's mark is 0 and the node would hold every new job for good.
UPPER_BOUNDS: dict[str, float] = {"store_headroom_pct": 99, "batch_jobs": 64, "runner_nice": 19}


def validate_algorithms(raw: object, _runners: Mapping[str, int]) -> dict[str, list[str]]:
    """``[algorithms]``: ``default`` or a context id -> a non-empty list of known algorithms."""
    if not isinstance(raw, dict):
        raise ConfigError("[algorithms] must be a table")
    for name, value in raw.items():
        if name != "default" and not (name.isdigit() and int(name) >= 1):
            raise ConfigError(f"[algorithms] {name!r}: keys are context ids or 'default'")
        known = isinstance(value, list) and value and all(v in ALGORITHMS for v in value)
        if not known:
            raise ConfigError(
                f"[algorithms] {name}: a non-empty list of {', '.join(ALGORITHMS)} (got {value!r})"
            )
    return {name: list(value) for name, value in raw.items()}


# The tables of config.toml beside [node]: each dict field of NodeConfig, checked by its validator
# (which knows [runners], read first) and carried over as the validator returns it.
_TABLES: dict[str, Callable[[object, Mapping[str, int]], Mapping[str, object]]] = {
    "commands": validate_commands,
    "runner_groups": validate_groups,
    "algorithms": validate_algorithms,
    "dlq_limits": lambda raw, _runners: validate_dlq_limits(raw),
    "queue_limits": lambda raw, _runners: validate_queue_limits(raw),
    "limits": lambda raw, _runners: _sandbox_table(parse_limits, raw),
    "sandbox": lambda raw, _runners: _sandbox_table(parse_sandbox, raw),
}


def _sandbox_table(parse: Callable[[object], dict[str, object]], raw: object) -> dict[str, object]:
    try:
        return parse(raw)
    except (LimitsError, SandboxSettingsError) as exc:
        raise ConfigError(str(exc)) from None


def validate_dlq_limits(raw: object) -> dict[str, int]:
    """Check ``[dlq_limits]`` (a context id, as a TOML key, -> its dlq bound, 0: none)."""
    if not isinstance(raw, Mapping) or not all(
        str(k).isdigit() and _fits(v, int) and v >= 0 for k, v in raw.items()
    ):
        raise ConfigError('[dlq_limits] maps a context id ("2" = ...) to a dlq bound >= 0')
    return {str(int(k)): int(v) for k, v in raw.items()}


QUEUE_LIMIT_NAMES = ("actor", "context")


def validate_queue_limits(raw: object) -> dict[str, dict[str, int]]:
    """Check ``[queue_limits]``: a context id -> ``{actor = N, context = N}`` (either or
    both, each >= 0; 0: no bound), that context's own queue bounds."""
    problem = '[queue_limits] maps a context id ("2" = ...) to {actor = N, context = N}, N >= 0'
    if not isinstance(raw, Mapping):
        raise ConfigError(problem)
    out: dict[str, dict[str, int]] = {}
    for ctx, bounds in raw.items():
        if not (str(ctx).isdigit() and isinstance(bounds, Mapping)):
            raise ConfigError(problem)
        if not all(k in QUEUE_LIMIT_NAMES and _fits(v, int) and v >= 0 for k, v in bounds.items()):
            raise ConfigError(f"{problem} (got {ctx} = {dict(bounds)!r})")
        out[str(int(ctx))] = {str(k): int(v) for k, v in bounds.items()}
    return out


def _fits(value: object, kind: type) -> bool:
    """Whether a TOML value may set a setting of type ``kind`` (an int serves as a float)."""
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, int | float)
    return isinstance(value, kind)


def load_config(home: Path) -> NodeConfig:
    """Read ``home/config.toml``; ConfigError says what is missing or wrong and how to fix it."""
    path = home / "config.toml"
    if not path.exists():
        raise ConfigError(
            f"no node configuration at {path}; create one with: hero-node init --home {home}"
        )
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    section = dict(raw.get("node", {}))
    legacy = _legacy(path, section)
    values: dict[str, object] = {}
    for name, kind in _SETTINGS.items():
        if name in section:
            if not _fits(section[name], kind):
                raise ConfigError(f"{path}: [node] {name} has the wrong type ({section[name]!r})")
            values[name] = section[name]
    runners = raw.get("runners", DEFAULT_RUNNERS)
    if not isinstance(runners, dict) or not all(_fits(v, int) and v >= 0 for v in runners.values()):
        raise ConfigError(
            f"{path}: [runners] maps a script type to a concurrency >= 0 "
            "(0: no local runner; external runners serve the type)"
        )
    unknown = set(section) - set(_SETTINGS)
    if unknown:
        raise ConfigError(f"{path}: unknown [node] setting(s): {', '.join(sorted(unknown))}")
    if values.get("link_encryption", "tls") not in LINK_ENCRYPTION:
        raise ConfigError(f'{path}: [node] link_encryption is "tls" (the default) or "none"')
    if values.get("isolation", "auto") not in MODES:
        raise ConfigError(f"{path}: [node] isolation is one of {', '.join(MODES)}")
    for name, low in LOWER_BOUNDS.items():
        if name in values and values[name] < low:  # type: ignore[operator]
            raise ConfigError(f"{path}: [node] {name} must be at least {low} (got {values[name]})")
    for name, high in UPPER_BOUNDS.items():
        if name in values and values[name] > high:  # type: ignore[operator]
            raise ConfigError(f"{path}: [node] {name} must be at most {high} (got {values[name]})")
    try:
        tables = {name: check(raw.get(name, {}), runners) for name, check in _TABLES.items()}
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        console = parse_console(raw.get("console", {}))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        store = parse_store(raw.get("store", {}))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    try:
        tracing = parse_tracing(raw.get("tracing", {}))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if store.replicated and values.get("redis_url"):
        raise ConfigError(f"{path}: [node] redis_url and [store] sentinels exclude each other")
    return NodeConfig(
        home=home,
        runners=dict(runners),
        console=console,
        store=store,
        tracing=tracing,
        legacy_settings=legacy,
        **tables,  # type: ignore[arg-type]
        **values,  # type: ignore[arg-type]
    )


LINK_ENCRYPTION = ("tls", "none")
# [node] settings older versions wrote: read no more, named at start (``tls = false`` came with
# every init before links were encrypted by default, so it asks for nothing)
_LEGACY = {"tls": bool}


def _legacy(path: Path, section: dict[str, object]) -> tuple[str, ...]:
    """Take the legacy settings out of ``section``; return them as "name = value"."""
    found = []
    for name, kind in _LEGACY.items():
        if name in section:
            value = section.pop(name)
            if not _fits(value, kind):
                raise ConfigError(f"{path}: [node] {name} has the wrong type ({value!r})")
            found.append(f"{name} = {str(value).lower()}")
    return tuple(found)


# What config.toml says above a setting or a table, for whoever edits it by hand.
_HELP = {
    "listen_host": "websocket listener for links from peer nodes; an IPv6 address (a Mycelium "
    "overlay\naddress, or :: for all) works too: peers then dial ws://[address]:port",
    "redis_url": "Redis/Valkey URL; leave empty to run an embedded Valkey (data in valkey/, AOF "
    "everysec).\nA Redis of your own needs ACL users and the default user off "
    "(docs/security/valkey.md);\nthe URL then names the node's user and password",
    "valkey_port": "the embedded Valkey listens on the unix socket run/valkey.sock (only this user "
    "may connect;\nevery role authenticates with its password in secrets/). A port (not 0) opens "
    "TCP too, on\nvalkey_host, for external runners on other machines: `hero-node runner "
    "credentials`",
    "actor_id": "the actor of actor.key and the context the node creates for it on first start",
    "flow_deadline_s": "a flow not over this long after its creation ends in error "
    "(flow_deadline), its unfinished\njobs too, unless its signed document sets its own "
    "deadline_s",
    "max_age_s": "freshness: refuse messages older than max_age_s or dated more than max_skew_s "
    "ahead;\nkeys and nonces of accepted messages are remembered for that window (replay "
    "protection)",
    "max_message_bytes": "a message (its stored fields) or a job's script larger than this is "
    'refused ("oversize")',
    "handshake_timeout_s": "an inbound connection has this long from its accept to finish TLS, "
    "the websocket\nupgrade and the node handshake, or it is closed",
    "max_pending_links": "at most this many inbound connections not yet authenticated (and "
    "max_pending_links_per_address\nfrom one address); more are closed at once and counted "
    '(hero_link_refusals_total{stage="listener"});\nthe addresses this node dials its peers '
    "at are exempt from the total",
    "grace_s": "on SIGTERM/SIGINT, running jobs get this long to finish",
    "link_encryption": '"tls": every link is TLS 1.3 (wss://, a self-signed certificate bound '
    "by the node\nhandshake to the node key, so no CA is involved); peers dial wss://host:port. "
    '"none": cleartext\nlinks anyone on the path can read: loud in logs, status, /metrics '
    "(docs/security/links.md)",
    "python_workers": "python jobs run in the slot's warm sandboxed interpreter (never in the "
    "runner\nprocess; [sandbox] fresh_process); false: one fresh interpreter per job, in the "
    "same sandbox",
    "batch_jobs": "a slot of python jobs in a warm sandbox takes at most this many of what is "
    "queued at once,\nruns them in one sandbox request and ends them in one script call (1-64; "
    "1: one at a time);\na lone job is never held for a batch",
    "runner_nice": "runner processes, and the job processes they start, run this many nice "
    "steps below the\nnode (0-19; 0: at the node's priority): where the CPU is short the node "
    "takes and\nmaterialises jobs first and each slot takes what queued meanwhile in one batch; "
    "on an idle\nmachine it changes nothing",
    "lease_ttl_ms": "a runner's lease on the job it runs, renewed every third of it; if it "
    "lapses because the\nrunner is gone, the attempt ends in error (runner_lost) and is retried "
    "while the job has\nretries left",
    "dlq_max_len": "each dlq (one per context, one in DB 0) keeps at most this many dead letters "
    "(0: no bound);\nthe oldest beyond it are appended to archive/dlq-<db>.jsonl and counted "
    "(dlq_archived)",
    "breaker_failures": "a peer whose dials or links fail this many times in a row has its "
    "circuit breaker opened:\nno dial for breaker_open_s, then breaker_probes at once; a job "
    "for it whose ack deadline\ncomes before that fails at once (peer_unavailable); a link that "
    "comes up closes it",
    "type_breaker_failures": "a script type whose jobs fail this many times in a row (errors "
    "other than stops and\nrefusals) has its circuit breaker opened: its runners take none of its "
    "jobs for\ntype_breaker_open_s (they wait in the queue), then type_breaker_probes at once; "
    "a success\ncloses it, a failed probe opens it again. 0: no breaker",
    "max_queued_per_actor": "queue bounds: an actor may hold at most this many jobs queued and "
    "not started yet in a\ncontext, a context at most max_queued_per_context (0: no bound); a "
    'message past either is\nrefused ("quota_exceeded"); [queue_limits] sets them per context',
    "fair_share_jobs": "fair share between actors: an actor holds at most this many of its "
    "jobs in a context's\nqueues; the rest wait in its own list and move to the queue as it "
    "drains, one actor after\nanother (0: off, first in first out)",
    "max_msg_in_per_peer": "a peer's link stores no more messages (they wait in the peer's "
    "outbox) while this many\nof them wait in msg_in for the consumer (0: no bound)",
    "disk_headroom_mb": "the node takes no new jobs (they wait in msg_out, msg_in or the peer's "
    "outbox) while the\nfile system of its home or its Valkey data has less free space than "
    "this, or its store uses\nmore than (100 - store_headroom_pct)% of store_max_memory_mb "
    "(0: half the machine's memory);\nchecked every pressure_check_s; status, /metrics and the "
    "log say so",
    "queue_limits": "optional: one context's own queue bounds, instead of max_queued_per_*; "
    'raising one is logged\nat start. Example:\n  "2" = { actor = 50000, context = 500000 }',
    "dlq_limits": "optional: the dlq bound of one context, instead of dlq_max_len; example:\n"
    '  "2" = 100',
    "on_dead_letter": "a command (split like a shell would, not run by one) started for each "
    'new dead letter,\nthe entry as JSON on its stdin (with its "db"); killed after '
    "on_dead_letter_timeout_s;\nits failure is logged and counted (dlq_hook_failed)",
    "runners": "concurrency of the runners per context, by script type (python and sh are built "
    "in;\nother types need a command below). python defaults to one slot per core (at most 8):"
    "\njobs that mostly wait (network, sleep) want more",
    "commands": "commands of other script types: a non-empty list of strings; placeholders "
    "{script_file}\n(the script in a 0600 temp file, removed after the job; else the script is "
    'on stdin),\n{job_id}, {caller_id}, {context_id}, {script_type}. Example:\n  v = ["v", '
    '"run", "{script_file}"]',
    "runner_groups": "optional: the group of this node's slots of a type; slot i then consumes"
    "\nqueue:<type>:group:<g>:inst:<i>, then queue:<type>:group:<g>, then queue:<type>",
    "isolation": 'how jobs are isolated (docs/security/sandbox.md): "auto" is '
    '"strict" where\nthe node may switch users (root, or CAP_SETUID+CAP_SETGID), else '
    '"namespaces"; with no sandbox\npossible the node runs no job, unless "none" (no isolation: '
    "loud in logs, status, /metrics)",
    "job_uid_base": "strict: the jobs of context N run as uid and gid job_uid_base + N "
    "(no /etc/passwd entry needed)",
    "limits": "limits of every job: processes, memory_mb, cpu_s (each job's whole tree where "
    "the node has cgroups),\ncpu_percent (the tree's CPU share, cgroups), open_files, "
    "file_size_mb, disk_mb (the context's\nwork dir as a whole, strict mode as root; 0: none); "
    "a [limits.<context id>] table overrides\nany of them for that context, loudly "
    "(docs/security/bounds.md)",
    "sandbox": "optional: bwrap (the program), recycle_jobs (the most jobs a warm sandbox "
    "runs before it is\nreplaced), fresh_process (true: each job in a fresh process of the "
    "sandbox; false, the "
    "default: python\njobs of a context run one after another in a warm process, and can see "
    "traces of each other);\n[sandbox.<context id>]: network = true lets that context's jobs "
    "use the network,\nrecycle_jobs = 1 gives each of its jobs a fresh sandbox, fresh_process "
    'as above for that context;\nwork_dir = "per_job" empties the work dir after each job '
    '(default "keep")',
    "algorithms": "optional: the actor key algorithms accepted per context id (or default), "
    'e.g.\n  default = ["ed25519", "secp256k1"]\n  "2" = ["secp256k1"]\nunset: '
    "both; an actor's signatures must be of its registered key's algorithm anyway",
}


def _commented(name: str, toml: str) -> str:
    note = _HELP.get(name)
    return "".join(f"# {line}\n" for line in note.splitlines()) + toml if note else toml


def render_config(cfg: NodeConfig) -> str:
    """The TOML text ``hero-node init`` writes, with comments explaining the settings; values
    are written (and escaped) by tomli-w, so any string loads back as it was."""
    settings = "".join(
        _commented(name, tomli_w.dumps({name: getattr(cfg, name)})) for name in _SETTINGS
    )
    tables = "\n".join(
        _commented(name, tomli_w.dumps({name: getattr(cfg, name)}))
        for name in ("runners", *_TABLES)
    )
    console = render_console(cfg.console)
    return (
        f"# hero-node configuration (see `hero-node --help`)\n[node]\n{settings}\n{tables}\n"
        f"{console}\n{render_store(cfg.store)}\n{render_tracing(cfg.tracing)}"
    )
