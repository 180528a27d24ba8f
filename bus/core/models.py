"""The six objects of the coordinator spec as frozen dataclasses with explicit to/from-hash.

Redis hashes hold strings: integers as decimal text, lists and maps as JSON. ``from_hash``
is strict: a missing or wrongly typed field raises :class:`ModelError` naming the field, so a
malformed hash can be dead-lettered with a clear reason instead of crashing a service. It reads
with msgspec, in C, from the dataclass's annotations (bus/core/codecs.py), and where msgspec
steps aside ``parse_hash``, the reference parser, reads field by field and names the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any, Self, TypeVar

import msgspec
import orjson

from bus.core import keys
from bus.core.codecs import MAX_INT, Count, codec_of, loads_json
from bus.core.errors import ModelError
from crypto import canonical_json

Hash = dict[str, str]
RawHash = Mapping[str, str] | Mapping[bytes, bytes]


class JobStatus(StrEnum):
    """A job's status; ``finished`` and ``error`` are final."""

    DISPATCHED = "dispatched"
    WAITING_FOR_PREREQUISITES = "waiting_for_prerequisites"
    STARTED = "started"
    ERROR = "error"
    FINISHED = "finished"

    @property
    def final(self) -> bool:
        return self in (JobStatus.ERROR, JobStatus.FINISHED)


class FlowStatus(StrEnum):
    """A flow's status; ``finished`` and ``error`` are final."""

    DISPATCHED = "dispatched"
    STARTED = "started"
    ERROR = "error"
    FINISHED = "finished"


class MessageStatus(StrEnum):
    DISPATCHED = "dispatched"
    ACKNOWLEDGED = "acknowledged"
    ERROR = "error"
    PROCESSED = "processed"


class MessageType(StrEnum):
    JOB = "job"
    CHAT = "chat"
    MAIL = "mail"
    RESULT = "result"  # extension: a signed job result travelling back (spec step 7)
    FLOW_JOB = "flow_job"  # extension: a flow's job, released and signed by the origin node
    STOP = "stop"  # extension: an actor's signed request to stop one of its jobs


class MessageFormat(StrEnum):
    HTML = "html"
    TEXT = "text"
    MD = "md"


# -- field codecs ------------------------------------------------------------------------------

E = TypeVar("E", bound=StrEnum)


def decode_hash(raw: RawHash) -> Hash:
    """Turn what Redis returned (bytes or str) into a ``str -> str`` dict."""
    out: Hash = {}
    for k, v in raw.items():
        key = k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
        out[key] = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
    return out


def _get(h: Mapping[str, str], name: str, default: str | None = None) -> str:
    value = h.get(name, default)
    if value is None:
        raise ModelError(f"missing field {name!r}")
    return value


def _int(h: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = h.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ModelError(f"missing field {name!r}")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ModelError(f"field {name!r} is not an integer: {raw[:40]!r}") from None
    if value < 0:
        raise ModelError(f"field {name!r} is negative: {value}")
    if value > MAX_INT:
        raise ModelError(f"field {name!r} is out of range: {raw[:40]}…")
    return value


def _json(h: Mapping[str, str], name: str, kind: type, default: Any) -> Any:  # noqa: ANN401
    raw = h.get(name)
    if raw is None or raw == "":
        return default
    value = loads_text(raw, f"field {name!r}")
    if not isinstance(value, kind):
        raise ModelError(f"field {name!r} must be a JSON {kind.__name__}")
    return value


# A JSON escape of a surrogate code point: only a pair of them stands for a character. A lone
# one decodes to a str that is no Unicode text (it cannot be encoded, so not signed, stored or
# logged), so parsing refuses it here, once, instead of each later step failing on it.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def dumps_json(value: object) -> bytes:
    """``json.dumps(value).encode()``'s JSON, written by orjson where it can (compact, the
    same values); what it cannot write (integers beyond 64 bits, lone surrogates) json does."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError is one
        return json.dumps(value).encode()


def json_arg(value: object) -> str:
    """``value`` (no floats: keys, fields, counts, a job's result, a client's reply) as the JSON
    text of a script argument: orjson's compact output, whose raw UTF-8 a script's cjson reads
    as it reads json.dumps' escapes; json.dumps for what orjson refuses (a lone surrogate, an
    integer beyond 64 bits): :func:`dumps_json`."""
    return dumps_json(value).decode()


def flat_fields(fields: Mapping[str, str]) -> list[str]:
    """A hash's fields as a script or a command takes them: ``[field, value, ...]``."""
    return [x for kv in fields.items() for x in kv]


def loads_text(raw: str, what: str) -> Any:  # noqa: ANN401 - any JSON value
    """``json.loads``, refusing (ModelError naming ``what``) invalid JSON, nesting too deep
    for the parser, and strings that are not Unicode text (lone surrogate escapes)."""
    try:
        value = loads_json(raw)
    except (ValueError, RecursionError):
        raise ModelError(f"{what} is not valid JSON (or nests too deeply)") from None
    if _SURROGATE_ESCAPE.search(raw) and not _scalar_values(value):
        raise ModelError(f"{what} holds a lone surrogate (\\uD800-\\uDFFF escape)")
    return value


def _scalar_values(value: object) -> bool:
    """Whether every string in a decoded JSON value (keys too) is valid Unicode text."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError, ValueError):
        return False
    return True


def _int_list(h: Mapping[str, str], name: str) -> list[int]:
    value = _json(h, name, list, [])
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_INT for x in value):
        raise ModelError(f"field {name!r} must be a list of non-negative integers")
    return list(value)


def _str_list(h: Mapping[str, str], name: str) -> list[str]:
    value = _json(h, name, list, [])
    if not all(isinstance(x, str) for x in value):
        raise ModelError(f"field {name!r} must be a list of strings")
    return list(value)


def _str_map(h: Mapping[str, str], name: str) -> dict[str, str]:
    value = _json(h, name, dict, {})
    if not all(isinstance(v, str) for v in value.values()):
        raise ModelError(f"field {name!r} must map strings to strings")
    return dict(value)


def _enum(h: Mapping[str, str], name: str, enum: type[E], default: E | None = None) -> E:
    raw = h.get(name)
    if raw is None and default is not None:
        return default
    try:
        return enum(_get(h, name))
    except ValueError:
        allowed = "|".join(e.value for e in enum)
        raise ModelError(f"field {name!r} is {raw!r}, expected one of {allowed}") from None


def _dump(value: object) -> str:
    """Compact JSON, non-ASCII as is: ``json.dumps(value, separators=(",", ":"),
    ensure_ascii=False)``, byte for byte (tests/bus/test_models.py). orjson writes those bytes
    several times faster; json writes what orjson refuses (an integer beyond 64 bits, a key
    that is no string, a lone surrogate) and floats, which the two print differently."""
    if not value and (type(value) is dict or type(value) is list):  # most jobs' maps and lists
        return "{}" if type(value) is dict else "[]"
    if _no_floats(value):
        try:
            return orjson.dumps(value).decode()
        except TypeError:  # orjson.JSONEncodeError is one
            pass
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


_JSON_SCALARS = frozenset((str, int, bool, type(None)))


def _no_floats(value: object, depth: int = 0) -> bool:
    """Whether ``value`` holds no float (nor anything but JSON's other types) at any depth.
    A scalar item is judged in the loop, not by a call of its own: a client checks every
    message's job list and signatures so (2.5 times faster, bench/HISTORY.md#submit-cpu)."""
    t = type(value)
    if t in _JSON_SCALARS:
        return True
    if depth > 64:
        return False
    if t is list:
        items: Iterable[object] = value  # type: ignore[assignment]
    elif t is dict:
        items = value.values()  # type: ignore[attr-defined]
    else:
        return False
    for item in items:
        if type(item) not in _JSON_SCALARS and not _no_floats(item, depth + 1):
            return False
    return True


def _text(value: object) -> str:
    """:func:`_as_str`, its common cases (an exact str or int, an empty map or list: a job
    hash holds four) without a second call."""
    t = type(value)
    if t is str:
        return value  # type: ignore[return-value]
    if t is int:
        return str(value)
    if not value and (t is dict or t is list):
        return "{}" if t is dict else "[]"
    return _as_str(value)


def _as_str(value: object) -> str:
    t = type(value)  # the common cases first: exact str and int (bool and StrEnum are not)
    if t is str:
        return value  # type: ignore[return-value]
    if t is int:
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, StrEnum):
        return value._value_  # the member's value: .value is a property, 4 times slower
    if isinstance(value, int | str):
        return str(value)
    return _dump(value)


def _to_hash(obj: object, names: tuple[str, ...]) -> Hash:
    return {name: _as_str(getattr(obj, name)) for name in names}


# -- objects -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Actor:
    id: Count
    pubkey: str
    address: list[str] = field(default_factory=list)
    created_at: Count = 0
    updated_at: Count = 0
    # the key's algorithm (crypto.ALGORITHMS); a hash without it is an Ed25519 actor's
    algorithm: str = "ed25519"

    FIELDS = ("id", "pubkey", "address", "created_at", "updated_at", "algorithm")

    def to_hash(self) -> Hash:
        return _to_hash(self, self.FIELDS)

    @classmethod
    def from_hash(cls, h: Mapping[str, str]) -> Self:
        if h.get("algorithm") != "":  # "" reads as ed25519 there
            found = codec_of(cls).decode(h)  # msgspec, exact or None (bus/core/codecs.py)
            if found is not None:
                return found
        return cls.parse_hash(h)

    @classmethod
    def parse_hash(cls, h: Mapping[str, str]) -> Self:
        """The reference parser (:meth:`from_hash`, naming the field it refuses)."""
        return cls(
            id=_int(h, "id"),
            pubkey=_get(h, "pubkey"),
            address=_str_list(h, "address"),
            created_at=_int(h, "created_at", 0),
            updated_at=_int(h, "updated_at", 0),
            algorithm=h.get("algorithm") or "ed25519",
        )


@dataclass(frozen=True, slots=True)
class Context:
    id: Count
    admins: list[Count] = field(default_factory=list)
    readers: list[Count] = field(default_factory=list)
    executors: list[Count] = field(default_factory=list)
    created_at: Count = 0
    updated_at: Count = 0

    FIELDS = ("id", "admins", "readers", "executors", "created_at", "updated_at")

    def may_execute(self, actor_id: int) -> bool:
        return actor_id in self.admins or actor_id in self.executors

    def to_hash(self) -> Hash:
        return _to_hash(self, self.FIELDS)

    @classmethod
    def from_hash(cls, h: Mapping[str, str]) -> Self:
        found = codec_of(cls).decode(h)  # msgspec, exact or None (bus/core/codecs.py)
        return cls.parse_hash(h) if found is None else found

    @classmethod
    def parse_hash(cls, h: Mapping[str, str]) -> Self:
        """The reference parser (:meth:`from_hash`, naming the field it refuses)."""
        return cls(
            id=_int(h, "id"),
            admins=_int_list(h, "admins"),
            readers=_int_list(h, "readers"),
            executors=_int_list(h, "executors"),
            created_at=_int(h, "created_at", 0),
            updated_at=_int(h, "updated_at", 0),
        )


@dataclass(frozen=True, slots=True)
class Flow:
    id: Count
    caller_id: Count
    context_id: Count
    jobs: list[Count] = field(default_factory=list)
    env_vars: dict[str, str] = field(default_factory=dict)
    result: dict[str, str] = field(default_factory=dict)
    created_at: Count = 0
    updated_at: Count = 0
    status: FlowStatus = FlowStatus.DISPATCHED

    FIELDS = (
        "id",
        "caller_id",
        "context_id",
        "jobs",
        "env_vars",
        "result",
        "created_at",
        "updated_at",
        "status",
    )
    HASH_REQUIRED = ("status",)  # a flow hash states it (bus/core/codecs.py)

    def to_hash(self) -> Hash:
        return _to_hash(self, self.FIELDS)

    @classmethod
    def from_hash(cls, h: Mapping[str, str]) -> Self:
        found = codec_of(cls).decode(h)  # msgspec, exact or None (bus/core/codecs.py)
        return cls.parse_hash(h) if found is None else found

    @classmethod
    def parse_hash(cls, h: Mapping[str, str]) -> Self:
        """The reference parser (:meth:`from_hash`, naming the field it refuses)."""
        return cls(
            id=_int(h, "id"),
            caller_id=_int(h, "caller_id"),
            context_id=_int(h, "context_id"),
            jobs=_int_list(h, "jobs"),
            env_vars=_str_map(h, "env_vars"),
            result=_str_map(h, "result"),
            created_at=_int(h, "created_at", 0),
            updated_at=_int(h, "updated_at", 0),
            status=_enum(h, "status", FlowStatus),
        )


@dataclass(frozen=True, slots=True)
class Runner:
    id: str
    pubkey: str = ""
    address: str = ""
    topic: str = ""
    local: bool = True
    script_type: str = ""
    created_at: Count = 0
    updated_at: Count = 0

    FIELDS = (
        "id",
        "pubkey",
        "address",
        "topic",
        "local",
        "script_type",
        "created_at",
        "updated_at",
    )

    def to_hash(self) -> Hash:
        return _to_hash(self, self.FIELDS)

    @classmethod
    def from_hash(cls, h: Mapping[str, str]) -> Self:
        return cls(
            id=_get(h, "id"),
            pubkey=h.get("pubkey", ""),
            address=h.get("address", ""),
            topic=h.get("topic", ""),
            local=h.get("local", "true") == "true",
            script_type=h.get("script_type", ""),
            created_at=_int(h, "created_at", 0),
            updated_at=_int(h, "updated_at", 0),
        )


# No __slots__ here nor on Message: msgspec reads a dataclass with them field by field through
# setattr, one with a __dict__ in one go, 3.7 -> 1.1 us per job decoded (a node parses every
# message it admits; bench/HISTORY.md#submit-cpu). Nor frozen, though both are values that no
# code changes: a frozen dataclass's __init__ sets each field through object.__setattr__, 7.2 us
# for either against 0.8, and a client builds one of each per job, a runner a Message
# (bench/HISTORY.md#plain-models). Neither could be hashed frozen either: both hold lists.
@dataclass
class RunnerJob:
    """A job (``job:<caller_id>:<id>``): a script of a type, run in a context; make one with
    :func:`bus.new_job`."""

    id: Count
    caller_id: Count
    context_id: Count
    script: str
    script_type: str
    timeout: Count = 60
    retries: Count = 0
    env_vars: dict[str, str] = field(default_factory=dict)
    result: dict[str, str] = field(default_factory=dict)
    prerequisites: list[str] = field(default_factory=list)
    depends: list[Count] = field(default_factory=list)
    created_at: Count = 0
    updated_at: Count = 0
    status: JobStatus = JobStatus.DISPATCHED
    message_key: str = ""  # extension: the message that carried this job
    reason: str = ""  # extension: why the job ended in error
    # extension: targeting (bus/core/queues.py); signed only when set, so that the signatures of
    # jobs without them (every older message) stay valid
    group: str = ""
    instance: str = ""
    priority: str = ""  # high | normal | low ("": normal)
    # extension: the retry policy (bus/core/attempts.py), signed and stored only when set
    # like the targeting: which failures are retried (empty: every one) and the backoff
    retry_on: list[str] = field(default_factory=list)
    backoff: str = ""  # exponential | linear ("": exponential)
    backoff_ms: Count = 0  # the delay before the first retry (0: the node's default)

    FIELDS = (
        "id",
        "caller_id",
        "context_id",
        "script",
        "script_type",
        "timeout",
        "retries",
        "env_vars",
        "result",
        "prerequisites",
        "depends",
        "created_at",
        "updated_at",
        "status",
        "message_key",
        "reason",
    )
    # What a message carries of a job, and so what the caller's signature covers.
    SIGNED = (
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
    )

    @property
    def key(self) -> str:
        return keys.job(self.caller_id, self.id)

    TARGETING = ("group", "instance", "priority")  # signed and stored only when non-empty
    RETRY_POLICY = ("retry_on", "backoff", "backoff_ms")  # the same

    def to_hash(self) -> Hash:
        return {
            name: _text(value)
            for name in _JOB_STORED
            if (value := getattr(self, name)) or name in _JOB_FIELDS
        }

    def signed_dict(self) -> dict[str, object]:
        return {
            name: _plain(value)
            for name in _JOB_SIGNED
            if (value := getattr(self, name)) or name in _JOB_ALWAYS_SIGNED
        }

    def stored_dict(self) -> dict[str, object]:
        """:meth:`signed_dict` without the entries that hold what :meth:`from_hash` assumes
        when they are absent: what a message hash stores of its job. Parsed back, it gives the
        same job, so the same signed content."""
        return {
            name: _plain(value)
            for name in _JOB_SIGNED
            if _JOB_OMITTED.get(name, _ANY) != (value := getattr(self, name))
        }

    @classmethod
    def from_hash(cls, h: Mapping[str, str]) -> Self:
        if "depends" in h or "dependends" not in h:
            job = codec_of(cls).decode(h)  # msgspec, exact or None (bus/core/codecs.py)
            if job is not None:
                return job.checked()
        return cls.parse_hash(h)

    def checked(self) -> Self:
        """This job, its retry policy checked (ModelError naming the field refused)."""
        if self.retry_on or self.backoff or self.backoff_ms:
            check_retry_policy(self.retry_on, self.backoff, self.backoff_ms)
        return self

    @classmethod
    def parse_hash(cls, h: Mapping[str, str]) -> Self:
        """The reference parser of a job hash: what :meth:`from_hash` gives, field by field,
        naming the field for a hash it refuses."""
        if "depends" not in h and "dependends" in h:  # the spec's spelling, accepted on read
            h = {**h, "depends": h["dependends"]}
        return cls(
            id=_int(h, "id"),
            caller_id=_int(h, "caller_id"),
            context_id=_int(h, "context_id"),
            script=_get(h, "script"),
            script_type=_get(h, "script_type"),
            timeout=_int(h, "timeout", 60),
            retries=_int(h, "retries", 0),
            env_vars=_str_map(h, "env_vars"),
            result=_str_map(h, "result"),
            prerequisites=_str_list(h, "prerequisites"),
            depends=_int_list(h, "depends"),
            created_at=_int(h, "created_at", 0),
            updated_at=_int(h, "updated_at", 0),
            status=_enum(h, "status", JobStatus, JobStatus.DISPATCHED),
            message_key=h.get("message_key", ""),
            reason=h.get("reason", ""),
            group=h.get("group", ""),
            instance=h.get("instance", ""),
            priority=h.get("priority", ""),
            **_retry_policy(h),
        )

    @classmethod
    def from_signed_dict(cls, d: object) -> Self:
        """Rebuild a job from a message's ``job`` list entry (JSON object)."""
        if not isinstance(d, dict):
            raise ModelError("a job entry must be a JSON object")
        # an int prints as json.dumps prints it (bool is not an int here: it dumps as JSON)
        flat = {
            k: v if isinstance(v, str) else str(v) if type(v) is int else _dump(v)
            for k, v in d.items()
        }
        return cls.from_hash(flat)


# One pass over a job's fields for each of its encodings (one comprehension each is half the
# Python of a dict per group merged, bench/codecs.py): the spec's fields always, the optional
# ones (targeting, retry policy) only when set.
_JOB_FIELDS = frozenset(RunnerJob.FIELDS)
_JOB_STORED = RunnerJob.FIELDS + RunnerJob.TARGETING + RunnerJob.RETRY_POLICY
_JOB_ALWAYS_SIGNED = frozenset(RunnerJob.SIGNED)
_JOB_SIGNED = RunnerJob.SIGNED + RunnerJob.TARGETING + RunnerJob.RETRY_POLICY


# A retry_on entry: a failure cause (bus/core/attempts.py) or an exit code, exit:any for all.
RETRY_CAUSE = re.compile(r"timeout|runner_lost|exit:(any|[1-9][0-9]{0,2})")
BACKOFFS = ("exponential", "linear")
MAX_BACKOFF_MS = 3_600_000


def _retry_policy(h: Mapping[str, str]) -> dict[str, Any]:
    """The retry policy fields of a job hash, checked (ModelError naming the bad one)."""
    retry_on, backoff = _str_list(h, "retry_on"), h.get("backoff", "")
    backoff_ms = _int(h, "backoff_ms", 0)
    check_retry_policy(retry_on, backoff, backoff_ms)
    return {"retry_on": retry_on, "backoff": backoff, "backoff_ms": backoff_ms}


def check_retry_policy(retry_on: list[str], backoff: str, backoff_ms: int) -> None:
    """ModelError naming the field of a retry policy the node refuses."""
    bad = [c for c in retry_on if not (m := RETRY_CAUSE.fullmatch(c)) or _code(m[1]) > 255]
    if bad:
        raise ModelError(
            f"field 'retry_on' holds {bad[0][:40]!r}: expected timeout, runner_lost, "
            "exit:<1-255> or exit:any"
        )
    if backoff not in ("", *BACKOFFS):
        raise ModelError(f"field 'backoff' is {backoff[:40]!r}, expected exponential|linear")
    if not 0 <= backoff_ms <= MAX_BACKOFF_MS:
        raise ModelError(f"field 'backoff_ms' is not within 0..{MAX_BACKOFF_MS}: {backoff_ms}")


def _code(text: str | None) -> int:
    return int(text) if text and text.isdigit() else 0


def _plain(value: object) -> object:
    t = type(value)
    if t is int or t is str:  # most fields (a StrEnum is a str subclass: not this type)
        return value
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


# What a stored message (and each job it carries) may leave out: the values from_hash assumes
# for an absent field, here and in every earlier version (so older readers parse it the same).
# Every field of the spec is stored (the contract); of the extensions, only what is set.
_MESSAGE_DEFAULTS = {"reason": "", "reply_to": "", "traceparent": "", "tracestate": ""}
_JOB_DEFAULTS: dict[str, object] = {
    "timeout": 60,
    "retries": 0,
    "env_vars": {},
    "prerequisites": [],
    "depends": [],
}
# what a stored job entry leaves out: the defaults above, and the optional fields when unset
_JOB_OMITTED: dict[str, object] = _JOB_DEFAULTS | {
    "group": "",
    "instance": "",
    "priority": "",
    "retry_on": [],
    "backoff": "",
    "backoff_ms": 0,
}
_ANY = object()


@dataclass
class Message:
    """A signed message (``message:<caller_id>:<id>``) carrying jobs to a node;
    :meth:`bus.Client.submit` returns it, :meth:`bus.Client.wait_results` takes it."""

    id: Count
    caller_id: Count
    context_id: Count
    message: str = ""
    message_type: MessageType = MessageType.JOB
    message_format_type: MessageFormat = MessageFormat.TEXT
    timeout: Count = 60
    timeout_ack: Count = 30
    timeout_result: Count = 3600
    job: list[RunnerJob] = field(default_factory=list)
    logs: list[dict[str, object]] = field(default_factory=list)
    created_at: Count = 0
    updated_at: Count = 0
    status: MessageStatus = MessageStatus.DISPATCHED
    # extensions (DESIGN.md 5): routing and signatures
    origin: str = ""  # node id (public key hex) of the node the message was submitted on
    destination: str = ""  # node id of the node that must process it
    nonce: str = ""
    signatures: list[dict[str, str]] = field(default_factory=list)
    reason: str = ""
    # the client's reply inbox (bus/core/keys.py reply_list); signed when set, stored when set
    reply_to: str = ""
    # W3C trace context (bus/core/tracecontext.py): signed when set, stored when set; judged
    # by whoever continues the trace, never by admission (a bad one is dropped, not refused)
    traceparent: str = ""
    tracestate: str = ""

    FIELDS = (
        "id",
        "caller_id",
        "context_id",
        "message",
        "message_type",
        "message_format_type",
        "timeout",
        "timeout_ack",
        "timeout_result",
        "job",
        "logs",
        "created_at",
        "updated_at",
        "status",
        "origin",
        "destination",
        "nonce",
        "signatures",
        "reason",
        "reply_to",
        "traceparent",
        "tracestate",
    )
    SIGNED = (
        "id",
        "caller_id",
        "context_id",
        "message",
        "message_type",
        "message_format_type",
        "timeout",
        "timeout_ack",
        "timeout_result",
        "created_at",
        "origin",
        "destination",
        "nonce",
    )
    # what a message hash must hold although the dataclass has a default for it
    HASH_REQUIRED = ("message_type", "created_at", "origin", "destination")

    @property
    def key(self) -> str:
        return keys.message(self.caller_id, self.id)

    def signed_json(self) -> bytes:
        """``canonical_json(self.signed_content())``, and its CanonicalError: printed in C by
        msgspec from the fields themselves where that gives exactly those bytes, which is what
        every sign and verify of a message asks (building and walking the dict took a fifth of
        the node's CPU samples: bench/HISTORY.md#signed-json)."""
        try:
            data = _SIGNED_ENCODER.encode(
                msgspec.convert(self, _SignedMessage, from_attributes=True)
            )
        except (msgspec.ValidationError, UnicodeError, TypeError, ValueError, RecursionError):
            data = b""  # a type, a range or a text the reference judges: it decides
        # ASCII only: then no key sorts apart from RFC 8785's UTF-16 order and no text holds
        # what the two might escape differently (tests/bus/test_signed_json.py)
        return data if data and data.isascii() else canonical_json(self.signed_content())

    def signed_content(self) -> dict[str, object]:
        """The immutable fields the signature covers (status, logs, updated_at are not)."""
        content = {name: _plain(getattr(self, name)) for name in self.SIGNED}
        content["job"] = [j.signed_dict() for j in self.job]
        # signed only when set: messages without them keep their signatures
        for name in _SIGNED_WHEN_SET:
            if value := getattr(self, name):
                content[name] = value
        return content

    def to_hash(self) -> Hash:
        """The stored hash: every spec field, the extensions that are set, and in ``job`` each
        job without the entries that hold their defaults (:meth:`RunnerJob.stored_dict`): the
        parsed message, and so its signed content, is the same, in less memory per queued
        message."""
        h = {
            name: _text(value)
            for name in _MESSAGE_STORED
            if (value := getattr(self, name)) != "" or name not in _MESSAGE_DEFAULTS
        }
        h["job"] = _dump([j.stored_dict() for j in self.job])
        return h

    @classmethod
    def from_hash(cls, h: Mapping[str, str]) -> Self:
        if '"dependends"' not in h.get("job", ""):  # the spec's spelling: see RunnerJob
            message = codec_of(cls).decode(h)  # msgspec, exact or None (bus/core/codecs.py)
            if message is not None:
                for job in message.job:
                    job.checked()
                return message
        return cls.parse_hash(h)

    @classmethod
    def parse_hash(cls, h: Mapping[str, str]) -> Self:
        """The reference parser of a message hash: what :meth:`from_hash` gives, field by
        field, naming the field for a hash it refuses."""
        jobs = _json(h, "job", list, [])
        signatures = _json(h, "signatures", list, [])
        if not all(isinstance(s, dict) for s in signatures):
            raise ModelError("field 'signatures' must be a list of objects")
        logs = _json(h, "logs", list, [])
        return cls(
            id=_int(h, "id"),
            caller_id=_int(h, "caller_id"),
            context_id=_int(h, "context_id"),
            message=h.get("message", ""),
            message_type=_enum(h, "message_type", MessageType),
            message_format_type=_enum(h, "message_format_type", MessageFormat, MessageFormat.TEXT),
            timeout=_int(h, "timeout", 60),
            timeout_ack=_int(h, "timeout_ack", 30),
            timeout_result=_int(h, "timeout_result", 3600),
            job=[RunnerJob.from_signed_dict(j) for j in jobs],
            logs=logs,
            created_at=_int(h, "created_at"),
            updated_at=_int(h, "updated_at", 0),
            status=_enum(h, "status", MessageStatus, MessageStatus.DISPATCHED),
            origin=_get(h, "origin"),
            destination=_get(h, "destination"),
            nonce=h.get("nonce", ""),
            signatures=signatures,
            reason=h.get("reason", ""),
            reply_to=h.get("reply_to", ""),
            traceparent=h.get("traceparent", ""),
            tracestate=h.get("tracestate", ""),
        )


_MESSAGE_STORED = tuple(name for name in Message.FIELDS if name != "job")  # job: its own way
# the extensions of a message signed only when non-empty, so older signatures stay valid
_SIGNED_WHEN_SET = ("reply_to", "traceparent", "tracestate")

# What the signature covers, as msgspec prints it for Message.signed_json: the fields of
# Message.SIGNED and RunnerJob.signed_dict, each typed as the reference canonicaliser accepts
# it (an integer within +/-(2**53 - 1)); a field signed only when set has its empty value as
# default, which omit_defaults leaves out exactly where signed_content does (tests check the
# two lists of names stay these).
_Safe = Annotated[int, msgspec.Meta(ge=-(2**53 - 1), le=2**53 - 1)]


class _SignedJob(msgspec.Struct, omit_defaults=True):
    id: _Safe
    caller_id: _Safe
    context_id: _Safe
    script: str
    script_type: str
    timeout: _Safe
    retries: _Safe
    env_vars: dict[str, str]
    prerequisites: list[str]
    depends: list[_Safe]
    group: str = ""
    instance: str = ""
    priority: str = ""
    retry_on: list[str] = []
    backoff: str = ""
    backoff_ms: _Safe = 0


class _SignedMessage(msgspec.Struct, omit_defaults=True):
    id: _Safe
    caller_id: _Safe
    context_id: _Safe
    message: str
    message_type: MessageType
    message_format_type: MessageFormat
    timeout: _Safe
    timeout_ack: _Safe
    timeout_result: _Safe
    created_at: _Safe
    origin: str
    destination: str
    nonce: str
    job: list[_SignedJob]
    reply_to: str = ""
    traceparent: str = ""
    tracestate: str = ""


_SIGNED_ENCODER = msgspec.json.Encoder(order="sorted")  # RFC 8785's key order, for ASCII keys


@dataclass(frozen=True, slots=True)
class Peer:
    """A known node (DB 0, ``peer:<node id>``): its id is its Ed25519 public key in hex."""

    id: str
    address: str = ""  # ws://host:port to dial; empty for a peer that only dials us
    name: str = ""
    created_at: Count = 0
    updated_at: Count = 0

    FIELDS = ("id", "address", "name", "created_at", "updated_at")

    def to_hash(self) -> Hash:
        return _to_hash(self, self.FIELDS)

    @classmethod
    def from_hash(cls, h: Mapping[str, str]) -> Self:
        return cls(
            id=_get(h, "id"),
            address=h.get("address", ""),
            name=h.get("name", ""),
            created_at=_int(h, "created_at", 0),
            updated_at=_int(h, "updated_at", 0),
        )
