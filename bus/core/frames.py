"""Transport frames: JSON objects with a type tag ``t``, decoded strictly. Pure, no I/O.

Handshake frames: ``hello`` (both sides), ``auth`` (initiator), ``welcome`` (responder).
Data frames: ``msgs`` (up to :data:`MAX_BATCH` message hashes, each for a context: whatever
the sender had ready, never held back to fill a batch) answered by ``acks`` (the keys stored
and queued, and the ``nacks``: keys refused, each with a reason; the sender dead-letters those
instead of retrying forever); one ``acks`` may answer several ``msgs`` frames that arrived
together (bus/wire/transport.py ``Link.post_answers``). A single message travels as a ``msgs``
frame of one: any other type tag is refused as an unknown frame. ``ask`` and ``tell`` carry a
trace ask and its answer (bus/core/traces.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

from bus.core.codecs import ascii_json, loads_json
from bus.core.errors import FrameError

DEFAULT_MAX_FRAME_BYTES = 4 * 1024 * 1024
MAX_BATCH = 256  # messages in one msgs frame, keys in one acks frame (acks + nacks)

_REQUIRED: dict[str, dict[str, type]] = {
    "hello": {"v": int, "node": str, "nonce": str},
    "auth": {"sig": str},
    "welcome": {"sig": str},
    "msgs": {"msgs": list},
    "acks": {"acks": list, "nacks": list},
    # a trace ask and its answer (bus/core/traces.py checks what they hold)
    "ask": {"ask": dict},
    "tell": {"tell": dict},
}
# The items of the list fields of batch frames. A msgs item's ``fields`` is only checked to be
# an object here: fields that are not all strings make that one message refused (nacked), not
# the whole frame.
_ITEMS: dict[str, dict[str, dict[str, type]]] = {
    "msgs": {"msgs": {"ctx": int, "key": str, "fields": dict}},
    "acks": {"acks": {"ctx": int, "key": str}, "nacks": {"ctx": int, "key": str, "reason": str}},
}
_MSGS_HEAD, _MSGS_TAIL = '{"t":"msgs","msgs":[', "]}"


@dataclass(frozen=True, slots=True)
class Frame:
    type: str
    body: Mapping[str, Any]


# -- the handshake frames, typed (bus/core/handshake.py checks what they say) -----------------
# Each is built from a frame :func:`decode_frame` accepted (which checked its fields' types) by
# ``of``, and encoded by ``encode``.


@dataclass(frozen=True, slots=True)
class Hello:
    """``hello`` (both sides): the sender's protocol version, node id and fresh nonce."""

    TYPE: ClassVar[str] = "hello"
    v: int
    node: str
    nonce: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Hello:
        return cls(body["v"], body["node"], body["nonce"])

    def encode(self) -> str:
        return encode_frame(self.TYPE, v=self.v, node=self.node, nonce=self.nonce)


@dataclass(frozen=True, slots=True)
class _Signed:
    """A handshake frame that carries one transcript signature."""

    TYPE: ClassVar[str]
    sig: str

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Self:
        return cls(body["sig"])

    def encode(self) -> str:
        return encode_frame(self.TYPE, sig=self.sig)


@dataclass(frozen=True, slots=True)
class Auth(_Signed):
    """``auth`` (initiator): its signature of the initiator's transcript, and (optional, not
    signed apart: the transcript holds it) the fingerprint of the TLS certificate it was shown,
    so that a responder shown another one can say so instead of only "bad signature"."""

    TYPE: ClassVar[str] = "auth"
    tls: str = ""

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> Self:
        tls = body.get("tls", "")
        return cls(body["sig"], tls if isinstance(tls, str) else "")

    def encode(self) -> str:
        return encode_frame(self.TYPE, sig=self.sig, tls=self.tls)


@dataclass(frozen=True, slots=True)
class Welcome(_Signed):
    """``welcome`` (responder): its signature of the responder's transcript."""

    TYPE: ClassVar[str] = "welcome"


Handshake = TypeVar("Handshake", Hello, Auth, Welcome)


# -- the bodies of data frames, typed: what a node does with them reads fields, not dicts ------


@dataclass(frozen=True, slots=True)
class MsgItem:
    """One message of a ``msgs`` frame. ``fields`` is only known to be an object: fields that
    are not all strings make this one message refused, not the frame."""

    ctx: int
    key: str
    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Ack:
    """A message the peer stored and queued."""

    ctx: int
    key: str


@dataclass(frozen=True, slots=True)
class Nack:
    """A message the peer refused: ``reason`` (a token) and ``detail``, carried on the wire as
    one ``"<reason>: <detail>"`` string, joined and split here only."""

    ctx: int
    key: str
    reason: str
    detail: str = ""

    def item(self) -> dict[str, object]:
        """The ``nacks`` item of an ``acks`` frame."""
        said = f"{self.reason}: {self.detail}" if self.detail else self.reason
        return {"ctx": self.ctx, "key": self.key, "reason": said}


def msgs_of(frame: Frame) -> list[MsgItem]:
    """The messages of a ``msgs`` frame (decoded by :func:`decode_frame`)."""
    return [MsgItem(m["ctx"], m["key"], m["fields"]) for m in frame.body["msgs"]]


def answers_of(frame: Frame) -> tuple[list[Ack], list[Nack]]:
    """The acks and the nacks of an ``acks`` frame (decoded by :func:`decode_frame`)."""
    acks = [Ack(a["ctx"], a["key"]) for a in frame.body["acks"]]
    nacks = []
    for n in frame.body["nacks"]:
        reason, _, detail = n["reason"].partition(": ")
        nacks.append(Nack(n["ctx"], n["key"], reason, detail))
    return acks, nacks


def encode_frame(frame_type: str, **body: Any) -> str:  # noqa: ANN401
    if frame_type not in _REQUIRED:
        raise FrameError(f"unknown frame type {frame_type!r}")
    return json.dumps({"t": frame_type, **body}, separators=(",", ":"))


def encode_msg_item(ctx: int, key: str, fields: Mapping[str, str]) -> str:
    """One message of a ``msgs`` frame, encoded once: the sender sizes batches by its length
    (ASCII: ``json.dumps`` escapes everything else, so characters are bytes)."""
    return ascii_json({"ctx": ctx, "key": key, "fields": fields})


def msgs_frame_size(item_sizes: int, count: int) -> int:
    """Bytes of the ``msgs`` frame holding ``count`` encoded items of ``item_sizes`` in all."""
    return len(_MSGS_HEAD) + item_sizes + max(count - 1, 0) + len(_MSGS_TAIL)


def encode_msgs(items: list[str]) -> str:
    """A ``msgs`` frame from items made by :func:`encode_msg_item`."""
    return _MSGS_HEAD + ",".join(items) + _MSGS_TAIL


def fields_are_strings(fields: Mapping[Any, Any]) -> bool:
    return all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())


def decode_frame(data: str | bytes, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Frame:
    """Parse and validate one frame; FrameError names what is wrong."""
    if isinstance(data, str):
        try:
            raw = data.encode()
        except UnicodeEncodeError:
            raise FrameError("frame is not valid UTF-8 text") from None
    else:
        raw = data
    size = len(raw)
    if size > max_bytes:
        raise FrameError(f"frame of {size} bytes exceeds the limit of {max_bytes}")
    try:
        obj = loads_json(raw)  # json.loads' values and errors, msgspec's speed
    except (ValueError, UnicodeDecodeError) as exc:
        raise FrameError(f"frame is not JSON: {exc}") from None
    except RecursionError:
        raise FrameError("frame nests too deeply") from None
    if b"\\ud" in raw.lower() and _has_surrogate(obj):  # escaped lone surrogates
        raise FrameError("frame holds a lone UTF-16 surrogate (not valid Unicode text)")
    if not isinstance(obj, dict):
        raise FrameError("frame is not a JSON object")
    frame_type = obj.get("t")
    if not isinstance(frame_type, str) or frame_type not in _REQUIRED:
        raise FrameError(f"unknown frame type {str(frame_type)[:40]!r}")
    _check_fields(f"{frame_type} frame", obj, _REQUIRED[frame_type])
    if frame_type in _ITEMS:
        _check_items(frame_type, obj)
    return Frame(frame_type, obj)


def _check_fields(what: str, obj: Mapping[str, Any], required: dict[str, type]) -> None:
    for name, kind in required.items():
        value = obj.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise FrameError(f"{what}: field {name!r} missing or not {kind.__name__}")


def _check_items(frame_type: str, obj: Mapping[str, Any]) -> None:
    """The list fields of a batch frame: objects with typed fields, at most MAX_BATCH in all."""
    lists = _ITEMS[frame_type]
    count = sum(len(obj[name]) for name in lists)
    if frame_type == "msgs" and count == 0:
        raise FrameError("msgs frame: no message")
    if count > MAX_BATCH:
        raise FrameError(f"{frame_type} frame: {count} items, more than {MAX_BATCH}")
    for name, required in lists.items():
        for i, item in enumerate(obj[name]):
            if not isinstance(item, dict):
                raise FrameError(f"{frame_type} frame: {name}[{i}] is not an object")
            _check_fields(f"{frame_type} frame, {name}[{i}]", item, required)


def _has_surrogate(value: object) -> bool:
    """True if a string anywhere in ``value`` cannot be encoded as UTF-8."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False
