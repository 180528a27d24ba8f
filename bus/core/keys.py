"""Every Redis key hero-node uses is built here, and nowhere else.

Contract: ``shared/seeds/coordinator-specs.md`` section 3 plus the extensions in
``shared/DESIGN.md`` section 4. Actors, peers and node-level bookkeeping live in DB 0;
everything that belongs to a context lives in that context's own DB (DB number = context id).
"""

from __future__ import annotations

import re

ACTORS_DB = 0

# -- objects (hashes) ------------------------------------------------------------------------


def actor(actor_id: int) -> str:
    return f"actor:{actor_id}"


ACTOR_PATTERN = "actor:*"  # SCAN pattern of every actor hash (DB 0)
JOB_PATTERN = "job:*"  # SCAN pattern of every job hash of a context DB
FLOW_PATTERN = "flow:*"  # SCAN pattern of every flow hash of a context DB


def context(context_id: int) -> str:
    return f"context:{context_id}"


def flow(flow_id: int) -> str:
    return f"flow:{flow_id}"


def message(caller_id: int, message_id: int) -> str:
    return f"message:{caller_id}:{message_id}"


def runner(runner_id: str) -> str:
    return f"runner:{runner_id}"


def job(caller_id: int, job_id: int) -> str:
    return f"job:{caller_id}:{job_id}"


def parse_message_key(key: str) -> tuple[int, int]:
    """``(caller_id, message_id)`` of a ``message:<caller_id>:<id>`` key; ValueError if not."""
    prefix, caller, ident = key.split(":")
    if prefix != "message":
        raise ValueError(f"not a message key: {key!r}")
    return int(caller), int(ident)


# -- queues (lists) in a context DB ------------------------------------------------------------

MSG_OUT = "msg_out"
MSG_IN = "msg_in"
# zset "<peer id>|<message key>" scored by the message's ack deadline (Unix s): job messages a
# previous boot of this node stored from a peer and may not have acknowledged, set aside until
# this boot has acknowledged them (node/intake/held.py)
MSG_HELD = "msg_held"


def held_member(peer: str, message_key: str) -> str:
    """The member of ``msg_held`` for ``message_key``, to be acknowledged again to ``peer``."""
    return f"{peer}|{message_key}"


DLQ = "dlq"
# every dead letter is also pushed here, for the node's dlq watcher (node/observe/dlq.py): its hook
# and the dlq bound see each entry once, whoever wrote it
DLQ_EVENTS = "dlq_events"


def queue(script_type: str) -> str:
    return f"queue:{script_type}"


def queue_group(script_type: str, group: str) -> str:
    return f"queue:{script_type}:group:{group}"


def queue_instance(script_type: str, group: str, instance: str) -> str:
    return f"queue:{script_type}:group:{group}:inst:{instance}"


def stop_queue(script_type: str) -> str:
    return f"stop:{script_type}"


def reply(message_key: str) -> str:
    """Dedicated reply list a waiting client BLPOPs (rhailib pattern)."""
    return f"reply:{message_key}"


# A client's reply inbox is named in its signed message (``reply_to``): untrusted input, so the
# node builds the key itself from a short name of a strict charset, and nothing else can be named.
INBOX_NAME_MAX = 64
_INBOX_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
# the same rule as one pattern, built from that set: a good name is accepted in one C call
_INBOX_NAME = re.compile(f"[{re.escape(''.join(sorted(_INBOX_CHARS)))}]{{1,{INBOX_NAME_MAX}}}")


def inbox_name_problem(name: str) -> str:
    """Why ``name`` cannot name a reply inbox ("" if it can): 1 to 64 of ``A-Za-z0-9_.-``."""
    if not name:
        return "empty inbox name"
    if _INBOX_NAME.fullmatch(name):  # one C call for every good name: checked per message
        return ""
    if len(name) > INBOX_NAME_MAX:
        return f"inbox name of {len(name)} characters > {INBOX_NAME_MAX}"
    bad = sorted(set(name) - _INBOX_CHARS)
    if bad:
        return f"inbox name holds {''.join(bad)!r} (allowed: A-Z a-z 0-9 _ - .)"
    return ""


def inbox(name: str) -> str:
    """The reply inbox of a client (a list it pops in batches); ValueError for a bad name."""
    problem = inbox_name_problem(name)
    if problem:
        raise ValueError(problem)
    return f"inbox:{name}"


def reply_list(message_key: str, reply_to: str = "") -> str:
    """The list every answer to message ``message_key``'s jobs is pushed on: the inbox its
    signed ``reply_to`` names, else :func:`reply`. Admission refuses a message with a bad name
    before any job of it runs; a name that went bad afterwards (its hash rewritten) falls back to
    the default, so an answer path never raises and never pushes on a key it did not build."""
    if reply_to and not inbox_name_problem(reply_to):
        return inbox(reply_to)
    return reply(message_key)


def inflight(service: str) -> str:
    """Per-consumer processing list for reliable pops (BLMOVE source -> here, LREM on ack)."""
    return f"inflight:{service}"


def logs(job_key: str) -> str:
    """Stream of a running job's output (entries: stream=stdout|stderr, data; end=status)."""
    return f"logs:{job_key}"


def attempts(job_key: str) -> str:
    """List of a job's attempts (JSON entries: attempt, runner, status, reason, times)."""
    return f"attempts:{job_key}"


REDELIVERIES = "redeliveries"  # hash: in-flight entry -> times it was recovered (poison guard)
DEADLINES = "deadlines"  # zset "ack|<message key>" / "result|<message key>" by due time (ms)
# sorted set of the started jobs (not final), each scored with its lease's expiry (ms, Valkey's
# clock: the scripts that start and renew an attempt set it); the lease's token is the job's
# runner field. Data model v2 had a set, and a string lease:<job> with a TTL per job.
RUNNING = "running"
V2_LEASE_PATTERN = "lease:*"  # the v2 leases, which the start-up migration folds into RUNNING
DELAYED = "delayed"  # zset of "<queue>|<job key>" scored by the time (ms) a retry is due


def presence_runner(runner_id: str) -> str:
    """A live runner's heartbeat (JSON, with a TTL it keeps refreshing); gone = not live."""
    return f"presence:runner:{runner_id}"


PRESENCE_RUNNER_PATTERN = "presence:runner:*"


def runner_inflight(runner_id: str) -> str:
    """The in-flight list of an external runner (docs/use/runners.md)."""
    return inflight(f"runner:{runner_id}")


# Job keys an external runner finished (final status and result written): the node answers
# them (reply or signed result message) and applies retries. See node/runners/external.py.
RESULTS = "results"
RESULTS_INFLIGHT = inflight(RESULTS)  # the results service's in-flight list

# Hash of job statistics of the context, counted by every script that starts or ends a job
# (bus/store/atomic/lua/stats_jobs.lua; fields ``<event>|<script type>[|...]``), read by
# node/observe/metrics.py. In Valkey, not in a node's memory: jobs end in runner processes too.
STATS_JOBS = "stats:jobs"
# Queue depth quotas of a context (node/intake/admission.py: queue bounds), data model v3: a
# hash of each actor's count of jobs queued and not started yet (field: the actor id); the
# context's depth is the sum of its values (no field of its own: a start moves one count, not
# two). A counted job holds QUOTA_COUNTED in its own hash, so a redelivery or a second start
# never moves a count twice, at no command at queueing (the field rides in the job's write).
# Kept by the scripts that queue and start or stop a job (bus/store/atomic/lua/quota_depth.lua).
# In Valkey: runner processes start jobs too.
QUOTA_DEPTH = "quota:depth"
QUOTA_COUNTED = "quota_counted"  # job hash field: "1" while the job counts for its actor
QUOTA_ALL = "all"  # the context's whole depth, as bus.store.records.quota_depths reports it
# Fair share between actors (bus/store/atomic/lua/quota_depth.lua quota_push, quota_refill.lua):
# an actor holding fair_share_jobs of its jobs in a context's queues has the rest wait, in order,
# in its own list of "<queue> <job key>" entries; the set names the actors with such a list.
# quota_left pushes QUOTA_FAIR_WAKE (one entry at most) while any actor waits; the node's
# run_fair_share blocks on it and refills the queues, round robin from QUOTA_FAIR_NEXT.
QUOTA_WAITING = "quota:waiting"
QUOTA_WAIT_PREFIX = "quota:wait:"
QUOTA_FAIR_WAKE = "quota:fair:wake"
QUOTA_FAIR_NEXT = "quota:fair:next"


def quota_wait(actor: int | str) -> str:
    """The waiting list of ``actor``'s jobs past its fair share of a context's queues."""
    return f"{QUOTA_WAIT_PREFIX}{actor}"


# hash: the circuit breaker of each script type of a context (bus/store/atomic/type_breakers.py)
TYPE_BREAKERS = "type_breakers"

# consumed in this order, with aging (bus/core/queues.py)
PRIORITIES = ("high", "normal", "low")


def queue_prio(base: str, priority: str) -> str:
    """The ``priority`` sub-queue of a job queue (``normal`` is the base queue itself)."""
    return base if priority == "normal" else f"{base}:prio:{priority}"


# -- node level (DB 0) -------------------------------------------------------------------------


def peer(node_id: str) -> str:
    return f"peer:{node_id}"


PEERS = "peers"  # set of known node ids
CONTEXTS = "contexts"  # set of context ids this node serves
NODE_EVENTS = (
    "node:events"  # list: "context:<id>" / "peer:<node id>" registrations, for live reload
)
# DB 0: a counter each durability barrier increments, so that the WAITAOF after it on the same
# connection covers every write made before it (bus/store/durable.py)
DURABLE = "durable"
# counter in DB 0, bumped (INCR) by every write of an actor or a context: a process that caches
# them (node/state.py) reads it once per admission and drops what was loaded under another value
REGISTRY_VERSION = "registry:version"
NODE_INFO = "node:info"  # hash: id, name, ws_url, redis_url of the node on this Redis


# DB 0: signed trace asks (bus/core/traces.py) a client hands its node to carry to a peer, and
# the list each answer is pushed on for the client that waits for it (node/links/trace.py)
TRACE_ASKS = "trace:asks"


def trace_told(ask_id: int) -> str:
    """The list the answer to trace ask ``ask_id`` is pushed on (expires soon after)."""
    return f"trace:told:{ask_id}"


def outbox(node_id: str) -> str:
    """Durable per-peer outbox: entries ``<context_id>|<message key>`` wait here until acked."""
    return f"outbox:{node_id}"


def outbox_inflight(node_id: str) -> str:
    return f"outbox:{node_id}:inflight"


def outbox_entry(context_id: int, message_key: str) -> str:
    """An entry of a peer's outbox lists: which message of which context to send."""
    return f"{context_id}|{message_key}"


def parse_outbox_entry(value: str) -> tuple[int, str]:
    """``(context id, message key)`` of an outbox entry; ValueError unless the context is a
    decimal number from 1 (DB 0 holds no messages) and a key follows."""
    ctx, _, key = value.partition("|")
    if not (ctx.isascii() and ctx.isdecimal() and len(ctx) <= 9 and int(ctx) > 0 and key):
        raise ValueError(f"not <context>|<message key>: {value[:80]!r}")
    return int(ctx), key


# Replay markers (data model v3): one hash per context DB whose fields expire one by one
# (Valkey 9 HSETEX): ``seen:<message key>`` for a message accepted, ``nonce:<caller_id>:<nonce>``
# for a caller's nonce used (its value: the message key), each for the replay window. One write
# and one read per batch of messages instead of two strings written and read per message.
REPLAY = "replay"


def nonce(caller_id: int, value: str) -> str:
    """The field of REPLAY that marks a caller's nonce used (expires with the window)."""
    return f"nonce:{caller_id}:{value}"


def seen(message_key: str) -> str:
    """The field of REPLAY that marks a message accepted (replay / duplicate protection)."""
    return f"seen:{message_key}"


# The stored data model's version, a string in DB 0 (PROTOCOL.md section 5): a node migrates a
# store of an older version at start (bus/store/migrate.py), then writes DATA_MODEL_VERSION here.
DATA_MODEL = "data_model"
DATA_MODEL_VERSION = 3
# data model v2 keys, read only to migrate them: the replay markers as strings with a TTL (their
# names are v3's REPLAY fields) and the set of each actor's queued jobs
V2_SEEN_PATTERN = "seen:*"
V2_NONCE_PATTERN = "nonce:*"
V2_QUOTA_JOBS_PATTERN = "quota:jobs:*"


# -- flows (context DB of the flow's origin) ---------------------------------------------------

FLOW_EVENTS = "flow_events"  # list of flow ids whose state may have changed (engine wake-ups)
FLOWS_ACTIVE = "flows:active"  # set of flow ids not final yet (re-evaluated on engine start)
FLOW_DEADLINES = "flow_deadlines"  # zset of flow ids not final yet, by deadline (s)


def flow_progress(flow_id: int) -> str:
    """List the engine LPUSHes on every evaluation of a flow; a waiting client BLPOPs it."""
    return f"flow_progress:{flow_id}"


def flow_job_claim(job_key: str) -> str:
    """At a destination: the message that materialised a flow job (each runs at most once)."""
    return f"flowjob:{job_key}"
