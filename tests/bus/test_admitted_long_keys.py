"""The admission stamp (bus/core/admitted.py) is HMAC-SHA256 for a key of any length: one
longer than SHA-256's block is hashed first, as RFC 2104 (and hmac.new) does."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from bus.core import admitted

FIELDS = {"id": "7", "caller_id": "1", "context_id": "2", "script": "print(1)", "status": "x"}


@pytest.mark.parametrize("size", [0, 32, 63, 64, 65, 100, 256])
def test_the_stamp_is_hmac_sha256_whatever_the_key_length(size: int) -> None:
    key = bytes(range(256))[:size]
    expected = hmac.new(key, admitted.mac_input(2, "job:1:7", FIELDS), hashlib.sha256).hexdigest()
    assert admitted.stamp(key, 2, "job:1:7", FIELDS) == expected
    assert admitted.problem(key, 2, "job:1:7", FIELDS | {admitted.FIELD: expected}) == ""
