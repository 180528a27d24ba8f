"""An inbox name (bus/core/keys.py) is 1 to 64 of A-Z a-z 0-9 _ - . : the pattern that accepts
the good names at once and the reasons given for the others say the same."""

from __future__ import annotations

import string

from hypothesis import given
from hypothesis import strategies as st

from bus.core import keys

ALLOWED = frozenset(string.ascii_letters + string.digits + "_-.")
NAMES = st.text(st.sampled_from(sorted(ALLOWED)) | st.characters(), max_size=70)


@given(NAMES)
def test_a_name_is_accepted_exactly_when_the_rule_allows_it(name: str) -> None:
    allowed = 0 < len(name) <= keys.INBOX_NAME_MAX and set(name) <= ALLOWED
    assert (keys.inbox_name_problem(name) == "") is allowed


def test_a_trailing_newline_is_no_inbox_name() -> None:
    assert "'\\n'" in keys.inbox_name_problem("inbox\n")
