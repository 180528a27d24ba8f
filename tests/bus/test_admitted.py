"""The admission stamp's bytes (bus/core/admitted.py: mac_input) are the canonical JSON that
PROTOCOL.md "Admission proof" names, whatever the text in the covered fields."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus.core import admitted

# any text a hash may hold, control characters, quotes, backslashes, non-BMP characters included
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
FIELDS = st.dictionaries(st.sampled_from(admitted.COVERED + ("status", "attempt")), TEXT)


def _canonical(ctx: int, job_key: str, fields: dict[str, str]) -> bytes:
    covered = {name: fields[name] for name in admitted.COVERED if name in fields}
    text = json.dumps(
        [admitted.DOMAIN, ctx, job_key, covered],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return text.encode("utf-8")


@given(st.integers(0, 2**31), TEXT, FIELDS)
def test_the_stamped_bytes_are_the_canonical_json(ctx: int, job_key: str, fields: dict) -> None:
    assert admitted.mac_input(ctx, job_key, fields) == _canonical(ctx, job_key, fields)


@given(st.lists(st.binary(min_size=1, max_size=64), min_size=1, max_size=6), FIELDS)
def test_the_stamp_is_the_hmac_of_those_bytes_under_each_key(
    keys: list[bytes], fields: dict
) -> None:
    # keys in turn and back (more than the keyed objects kept): none stamps under another
    for key in keys + keys[::-1]:
        expected = hmac.new(key, _canonical(1, "job:1:1", fields), hashlib.sha256).hexdigest()
        assert admitted.stamp(key, 1, "job:1:1", fields) == expected


def test_a_field_that_is_not_utf8_text_has_no_stamp() -> None:
    fields = {"id": "1", "script": "print(1)\udcff"}  # read with surrogate escapes
    with pytest.raises(ValueError, match="not UTF-8"):
        admitted.mac_input(1, "job:1:1", fields)
    assert "not UTF-8" in admitted.problem(b"k" * 32, 1, "job:1:1", fields | {"admitted": "ab"})
