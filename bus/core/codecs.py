"""The models' codecs in C (msgspec, orjson): Redis hashes, and the JSON text of frames and replies.

A model's Redis hash holds strings: counts as decimal text, lists and maps as JSON. msgspec reads
one from the dataclass's own annotations (a count's bounds are ``Annotated`` metadata), twice as
fast as ``bus/core/models.py``'s reference parsers read it field by field (bench/codecs.py;
bench/HISTORY.md#msgspec-codecs).

The fast path is exact or it steps aside: :meth:`HashCodec.decode` returns ``None`` for any
hash it cannot read to the very value the reference parser gives (a count not written as plain
ASCII digits, an empty field meaning its default, a lone surrogate escape, a value of another
type, a missing field), and the reference parser then decides: it accepts what it always
accepted and names the reason for what it refuses, in the words it always used. The JSON text
helpers do the same with json: :func:`loads_json` gives json.loads' values or its error,
:func:`ascii_json` json.dumps' bytes (tests/bus/test_codecs.py checks each pair agrees).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Generic, TypeVar

import msgspec
import orjson

# Integers are what Redis counts in (64-bit): a larger one is no id, time or count of ours,
# and would overflow wherever it meets a float (a timeout) or a Lua number.
MAX_INT = 2**63 - 1
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_INT)]
"""An id, time or count: non-negative and 64-bit, checked by msgspec where it decodes one."""

T = TypeVar("T")

# What msgspec raises for input it refuses, and what Python raises on the way there (a str
# that is no Unicode text cannot be encoded for the parser; nesting beyond its stack).
_REFUSED = (msgspec.MsgspecError, UnicodeError, RecursionError, TypeError, ValueError)


def _is_int(hint: object) -> bool:
    return hint is int or (typing.get_origin(hint) is Annotated and hint.__origin__ is int)  # type: ignore[attr-defined]


class HashCodec(Generic[T]):
    """Reads a model's hash in C: the JSON fields by a typed msgspec decoder each, the rest by
    ``msgspec.convert`` into the dataclass (counts from their text, enums from their values,
    absent fields their dataclass defaults).

    ``required`` names the fields the hash must hold although the dataclass has a default for
    them (a message's ``origin``); fields without a default are required anyway.
    """

    def __init__(self, cls: type[T], *, required: Iterable[str] = ()) -> None:
        hints = typing.get_type_hints(cls, include_extras=True)
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        self._cls = cls
        self._ints = tuple(f.name for f in fields if _is_int(hints[f.name]))
        self._json = tuple(
            (f.name, msgspec.json.Decoder(hints[f.name]))
            for f in fields
            if typing.get_origin(hints[f.name]) in (list, dict)
        )
        no_default = {
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        self._required = frozenset(required) | no_default

    def decode(self, h: Mapping[str, str]) -> T | None:
        """The model ``h`` holds, or None where the reference parser must judge it."""
        if not self._required <= h.keys():
            return None
        d: dict[str, Any] = dict(h)
        try:
            for name, decoder in self._json:
                raw = d.get(name)
                if raw:
                    d[name] = decoder.decode(raw)
                elif raw is not None:  # "" reads as the default, which convert fills in
                    del d[name]
            # convert reads "1.0" and "1e3" as counts; int() and so the reference refuse them
            digits = "".join([d[name] for name in self._ints if name in d])
            if digits and not (digits.isascii() and digits.isdigit()):
                return None
            return msgspec.convert(d, self._cls, strict=False)
        except _REFUSED:
            return None


_CODECS: dict[type, HashCodec[Any]] = {}


def codec_of(cls: type[T]) -> HashCodec[T]:
    """The hash codec of a model dataclass, built once; a class's ``HASH_REQUIRED`` names the
    fields its hash must hold although they have a default."""
    codec = _CODECS.get(cls)
    if codec is None:
        codec = _CODECS[cls] = HashCodec(cls, required=getattr(cls, "HASH_REQUIRED", ()))
    return codec


# -- JSON text ---------------------------------------------------------------------------------


def loads_json(raw: str | bytes) -> Any:  # noqa: ANN401 - any JSON value
    """``json.loads(raw)``: msgspec parses what it accepts to the same values, several times
    faster; what it refuses (NaN, numbers out of a double's range, deep nesting, lone
    surrogates, escaped or not, bytes in UTF-16) json.loads judges, as it always did (its
    ValueError or RecursionError). Not orjson: it reads an integer beyond 64 bits as a float,
    where json keeps it exact."""
    try:
        return msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeError):  # UnicodeError: a lone surrogate
        return json.loads(raw)


def ascii_json(value: dict[str, Any], *, sort_keys: bool = False) -> str:
    """``json.dumps(value, separators=(",", ":"), sort_keys=sort_keys)``: compact, ASCII only,
    byte for byte. orjson writes it where the two agree: every value of ``value`` a str, an int
    or a map of strs, and the text all ASCII but DEL, which json escapes; json writes the rest
    (orjson is 5 times faster, bench/codecs.py)."""
    if _all_text(value):
        option = orjson.OPT_SORT_KEYS if sort_keys else 0
        try:
            out = orjson.dumps(value, option=option)
        except TypeError:  # orjson.JSONEncodeError: a key that is no str, a lone surrogate
            pass
        else:
            if out.isascii() and b"\x7f" not in out:
                return out.decode()
    return json.dumps(value, separators=(",", ":"), sort_keys=sort_keys)


def _all_text(value: dict[str, Any]) -> bool:
    for item in value.values():
        t = type(item)
        if t is dict:
            if not all(type(v) is str for v in item.values()):
                return False
        elif t is not str and t is not int:
            return False
    return True
