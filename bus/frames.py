"""Transport frames: JSON objects with a type tag ``t``, decoded strictly. Pure, no I/O.

Handshake frames: ``hello`` (both sides), ``auth`` (initiator), ``welcome`` (responder).
Data frames: ``msg`` (a message hash for a context), ``ack`` (it is stored and queued),
``nack`` (refused, with a reason; the sender dead-letters it instead of retrying forever).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bus.errors import FrameError

DEFAULT_MAX_FRAME_BYTES = 4 * 1024 * 1024

_REQUIRED: dict[str, dict[str, type]] = {
    "hello": {"v": int, "node": str, "nonce": str},
    "auth": {"sig": str},
    "welcome": {"sig": str},
    "msg": {"ctx": int, "key": str, "fields": dict},
    "ack": {"ctx": int, "key": str},
    "nack": {"ctx": int, "key": str, "reason": str},
}


@dataclass(frozen=True, slots=True)
class Frame:
    type: str
    body: Mapping[str, Any]


def encode_frame(frame_type: str, **body: Any) -> str:  # noqa: ANN401
    if frame_type not in _REQUIRED:
        raise FrameError(f"unknown frame type {frame_type!r}")
    return json.dumps({"t": frame_type, **body}, separators=(",", ":"))


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
        obj = json.loads(raw)
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
    for name, kind in _REQUIRED[frame_type].items():
        value = obj.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise FrameError(f"{frame_type} frame: field {name!r} missing or not {kind.__name__}")
    if frame_type == "msg" and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in obj["fields"].items()
    ):
        raise FrameError("msg frame: fields must map strings to strings")
    return Frame(frame_type, obj)


def _has_surrogate(value: object) -> bool:
    """True if a string anywhere in ``value`` cannot be encoded as UTF-8."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False
