"""The admission proof of a job hash: a MAC the node stamps when it materialises an admitted job
and the runner process checks before it runs one. Pure: no I/O.

A runner pops job keys from a queue that anyone holding the ``runner`` password (an external
runner, a stolen password, a job that read one) can push to, and it runs what the hash says. The
signature of the message that carried the job is not in the hash, and checking it at the runner
would mean the registry, freshness, replay and permission checks all over again. Instead the one
admission function (node/intake/admission.py) decides, and the node stamps its verdict into the
hash: HMAC-SHA256 under a key only the node and its runner processes hold (``secrets/
admission.key`` of the home), over everything that decides what runs, where and as whom. A hash
written by anyone else, or an admitted one whose script, env or caller was changed, has no valid
stamp, and the runner refuses it (``not_admitted``) instead of running it.

The bytes the MAC covers (:func:`mac_input`), documented in PROTOCOL.md "Admission proof":

    canonical JSON (sorted keys, no whitespace, UTF-8) of
    ["hero-node/admitted/v1", <context DB number>, <job key>, {<field>: <value>, ...}]

with every field of :data:`COVERED` that the hash holds, as the exact string stored. Absent
fields are left out (an added one changes the bytes). Fields a run changes (status, attempt,
result, timestamps, ...) are not covered, so retries and recovery of an admitted job keep its
stamp.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Mapping

import orjson

DOMAIN = "hero-node/admitted/v1"
FIELD = "admitted"  # the job hash field that holds the stamp (hex)
KEY_BYTES = 32

# What decides what runs, for whom, in which context and where its answer goes: every field
# RunnerJob.from_hash reads that is not state, plus the routing of the answer.
COVERED = (
    "id",
    "caller_id",
    "context_id",
    "script",
    "script_type",
    "timeout",
    "retries",
    "env_vars",
    "prerequisites",
    "depends",
    "dependends",  # the spec's spelling, read when depends is absent
    "group",
    "instance",
    "priority",
    "retry_on",
    "backoff",
    "backoff_ms",
    "message_key",
    "origin",
    "reply_to",
    "traceparent",
    "tracestate",
)


def mac_input(ctx: int, job_key: str, fields: Mapping[str, str]) -> bytes:
    """The bytes the stamp covers; ValueError if a value is not UTF-8 text (a hash read with
    surrogate escapes)."""
    covered = {name: fields[name] for name in COVERED if name in fields}
    # orjson writes exactly the bytes of json.dumps(sort_keys=True, separators=(",", ":"),
    # ensure_ascii=False) for this shape (ASCII keys, text values: tests/bus/test_admitted.py)
    # at a tenth of the cost, paid by the runner for every job
    try:
        return orjson.dumps([DOMAIN, ctx, job_key, covered], option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:  # a lone surrogate: the hash was not UTF-8
        raise ValueError("a covered field is not UTF-8 text") from exc


def stamp(key: bytes, ctx: int, job_key: str, fields: Mapping[str, str]) -> str:
    """The stamp (hex) of job ``job_key`` with ``fields`` in context DB ``ctx``."""
    mac = _keyed(key).copy()
    mac.update(mac_input(ctx, job_key, fields))
    return mac.hexdigest()


@functools.lru_cache(maxsize=4)
def _keyed(key: bytes) -> hmac.HMAC:
    """An HMAC-SHA256 with ``key`` set up, copied per stamp (a process holds one key). The
    one-shot ``hmac.digest`` fetches the digest from OpenSSL by name and sets the key up on
    every call: a lone job's stamp, in a process woken with cold caches, took ~43 us so and
    ~20 as a copy, paid by the node and again by the runner (bench/HISTORY.md#lone-job-2)."""
    return hmac.new(key, digestmod=hashlib.sha256)


def problem(key: bytes, ctx: int, job_key: str, fields: Mapping[str, str]) -> str:
    """Why the hash ``fields`` of ``job_key`` in DB ``ctx`` bears no valid stamp ("" if it
    does): what the runner puts in its dead letter."""
    given = fields.get(FIELD, "")
    if not given:
        return "the job hash carries no admission stamp: it was not materialised by this node"
    try:
        expected = stamp(key, ctx, job_key, fields)
    except ValueError as exc:
        return str(exc)
    if not hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode()):
        return "the admission stamp does not match the job hash: written or changed after admission"
    return ""
