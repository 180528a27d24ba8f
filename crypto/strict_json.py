"""Strict JSON reading: how a document is read (a key file, the ``hero-verify`` input), never
how it is signed.

UTF-8 only, no duplicate keys, no floats, no NaN/Infinity, and the rules of the signed bytes
(crypto/signing.py: safe integer range, nesting depth).

Invariant: every value returned by :func:`loads_strict` is accepted by ``canonical_json``.
"""

from __future__ import annotations

import json
from typing import NoReturn

from crypto.errors import CanonicalError
from crypto.signing import check_canonical_value

__all__ = ["loads_strict"]


def _refuse_float(text: str) -> NoReturn:
    raise CanonicalError(f"number {text} is not an integer; floats are not allowed")


def _refuse_constant(text: str) -> NoReturn:
    raise CanonicalError(f"{text} is not valid JSON")


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for key, value in pairs:
        if key in result:
            raise CanonicalError(f"duplicate object key {key!r}")
        result[key] = value
    return result


def loads_strict(data: bytes | str) -> object:
    """Parse JSON strictly: UTF-8 only, no duplicate keys, no floats, no NaN/Infinity.

    The result is also checked with the same rules as :func:`canonical_json` (safe integer
    range, valid Unicode, nesting depth), so anything returned here can be canonicalised.

    Raises:
        CanonicalError: the input is not valid UTF-8 / JSON or breaks one of the rules above.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
        if not isinstance(text, str):
            raise CanonicalError(f"cannot parse JSON from {type(data).__name__}")
        value = json.loads(
            text,
            object_pairs_hook=_refuse_duplicates,
            parse_float=_refuse_float,
            parse_constant=_refuse_constant,
        )
    except UnicodeDecodeError as exc:
        raise CanonicalError(f"input is not valid UTF-8: {exc}") from exc
    except RecursionError as exc:
        raise CanonicalError("JSON is nested too deeply") from exc
    except ValueError as exc:  # json.JSONDecodeError, int digit limit
        raise CanonicalError(f"invalid JSON: {exc}") from exc
    check_canonical_value(value, "$", 0)
    _check_unicode(value)
    return value


def _check_unicode(value: object) -> None:
    """Refuse strings (values or keys) that cannot be encoded as UTF-8, e.g. lone surrogates.

    Raises:
        CanonicalError: a string contains a lone surrogate escape such as ``\\ud800``.
    """
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise CanonicalError(f"string {item!r} is not valid Unicode") from exc
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
