"""Canonical encoding (RFC 8785 / JCS, integer-only) and strict JSON parsing.

Signed content is always a JSON value made of ``None``, ``bool``, ``int`` (within the exact
range of an IEEE double, ``|n| <= 2**53 - 1``), ``str``, ``list``/``tuple`` and ``dict`` with
``str`` keys. Floats are refused everywhere: two implementations can disagree on how to print
them, and a signature must never depend on that.

Invariant: every value returned by :func:`loads_strict` is accepted by :func:`canonical_json`.
"""

from __future__ import annotations

import json
import re
from typing import NoReturn

import orjson
import rfc8785

from crypto.errors import CanonicalError

__all__ = [
    "DOMAIN_PREFIX",
    "MAX_DEPTH",
    "MAX_SAFE_INTEGER",
    "canonical_json",
    "loads_strict",
    "signing_input",
]

DOMAIN_PREFIX = "hero-bus/v1/"
MAX_SAFE_INTEGER = 2**53 - 1
"""Largest integer JCS represents exactly (JavaScript Number.MAX_SAFE_INTEGER)."""
MAX_DEPTH = 128
"""Maximum nesting of arrays/objects accepted in canonical content."""

_DOMAIN_RE = re.compile(r"[a-z0-9_-]+")


def _jcs_bytes(value: object) -> bytes:
    """Serialise ``value`` with RFC 8785 (JCS) *allowing floats*; internal, used for conformance.

    Raises:
        CanonicalError: rfc8785 refused the value (NaN/Infinity, unsafe integer, lone surrogate,
            non-str key, unsupported type) or it is nested too deeply.
    """
    try:
        return rfc8785.dumps(value)  # type: ignore[arg-type]
    except RecursionError as exc:
        raise CanonicalError("content is nested too deeply to canonicalise") from exc
    except (ValueError, TypeError) as exc:  # rfc8785.CanonicalizationError is a ValueError
        raise CanonicalError(f"content cannot be canonicalised (RFC 8785): {exc}") from exc


def _fail(path: str, what: str) -> NoReturn:
    raise CanonicalError(f"{what} at {path}; signed content must be integer-only JSON")


def _check_value(value: object, path: str, depth: int) -> bool:
    """Walk ``value`` and refuse anything outside integer-only JSON. Returns True if an object
    key holds a character outside the BMP (the only case where JCS's UTF-16 key order differs
    from Python's code-point order).

    Raises:
        CanonicalError: float, unsafe integer, non-str key, unsupported type, or too deep.
    """
    if value is None or isinstance(value, bool | str):
        return False
    if isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            _fail(path, f"integer {value} is outside +/-(2**53 - 1) and cannot be represented")
        return False
    if isinstance(value, float):
        _fail(path, f"float {value!r} is not allowed")
    if depth >= MAX_DEPTH:
        _fail(path, f"nesting deeper than {MAX_DEPTH} levels")
    astral = False
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            if type(item) is not str:
                astral |= _check_value(item, f"{path}[{index}]", depth + 1)
        return astral
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                _fail(path, f"object key {key!r} of type {type(key).__name__} is not a string")
            if not key.isascii() and max(key) > "\uffff":
                astral = True
            if type(item) is not str:
                astral |= _check_value(item, f"{path}.{key}", depth + 1)
        return astral
    _fail(path, f"value of unsupported type {type(value).__name__}")


_ORJSON = orjson.OPT_SORT_KEYS | orjson.OPT_STRICT_INTEGER


def _fast_admits(value: object, depth: int = 0) -> bool:
    """True if ``value`` is made only of the exact types None, bool, int (within the safe
    range), str, list, tuple and dict with str keys inside the BMP, at most :data:`MAX_DEPTH`
    deep: content for which orjson with sorted keys prints exactly the RFC 8785 bytes (integers
    print alike; orjson escapes strings as JCS does, ``\\uXXXX`` lowercase for the other control
    characters; sorted code points equal sorted UTF-16 code units inside the BMP). Anything else,
    subclasses included, goes the reference way. No paths are built: this runs per message."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER  # type: ignore[operator]
    if depth >= MAX_DEPTH:
        return False
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str or (not key.isascii() and max(key) > "\uffff"):
                return False
            # text and counts (most of a message) judged here, without a call of their own
            t = type(item)
            if t is int:
                if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                    return False
            elif t is not str and not _fast_admits(item, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:  # type: ignore[attr-defined]
            t = type(item)
            if t is int:
                if not -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                    return False
            elif t is not str and not _fast_admits(item, depth + 1):
                return False
        return True
    return False


def canonical_json(value: object) -> bytes:
    """Return the RFC 8785 (JCS) canonical bytes of an integer-only JSON value.

    Fast path: content :func:`_fast_admits` is printed by orjson with sorted keys (about 50
    times cheaper than the reference; tests/crypto/test_crypto_props.py checks both agree
    wherever the guard admits). Everything else (subclasses of the JSON types, keys outside the
    BMP, whose UTF-16 order differs, and anything to refuse) goes through :func:`_check_value`,
    which names what is wrong, and the ``rfc8785`` reference implementation.

    Raises:
        CanonicalError: the value contains a float (anywhere), an integer outside
            ``+/-(2**53 - 1)``, a non-str dict key, a type other than
            None/bool/int/str/list/tuple/dict, a string that is not valid Unicode
            (lone surrogate), or is nested more than :data:`MAX_DEPTH` levels.
    """
    try:
        if _fast_admits(value):
            return orjson.dumps(value, option=_ORJSON)
    except orjson.JSONEncodeError:
        pass  # a lone surrogate: the reference path says so precisely
    except RecursionError as exc:
        raise CanonicalError("content is nested too deeply to canonicalise") from exc
    _check_value(value, "$", 0)
    return _jcs_bytes(value)


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
    _check_value(value, "$", 0)
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


def signing_input(domain: str, value: object) -> bytes:
    """Return the exact bytes that get signed: ``hero-bus/v1/<domain>\\n<canonical JSON>``.

    The domain separates kinds of signed objects, so a signature over one kind can never be
    replayed as another.

    Raises:
        CanonicalError: ``domain`` is not a non-empty token of ``[a-z0-9_-]``, or ``value``
            cannot be canonicalised (see :func:`canonical_json`).
    """
    head = _HEADS.get(domain) if type(domain) is str else None
    if head is None:
        if not isinstance(domain, str) or not _DOMAIN_RE.fullmatch(domain):
            raise CanonicalError(
                f"invalid signing domain {domain!r}: must be a non-empty token of [a-z0-9_-]"
            )
        head = DOMAIN_PREFIX.encode("ascii") + domain.encode("ascii") + b"\n"
        if len(_HEADS) < _HEADS_MAX:
            _HEADS[domain] = head
    return head + canonical_json(value)


# the checked prefix of each domain seen (a handful: one per kind of signed object), so that
# signing or verifying one object does not check and encode its domain again
_HEADS: dict[str, bytes] = {}
_HEADS_MAX = 64
