"""The admission stamp's bytes (bus/core/admitted.py: mac_input) are the canonical JSON that
PROTOCOL.md "Admission proof" names, whatever the text in the covered fields."""

from __future__ import annotations

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


def test_a_field_that_is_not_utf8_text_has_no_stamp() -> None:
    fields = {"id": "1", "script": "print(1)\udcff"}  # read with surrogate escapes
    with pytest.raises(ValueError, match="not UTF-8"):
        admitted.mac_input(1, "job:1:1", fields)
    assert "not UTF-8" in admitted.problem(b"k" * 32, 1, "job:1:1", fields | {"admitted": "ab"})
