"""Identifiers and wall-clock time, in one injectable place.

Ids are random 53-bit integers: globally unique without coordination between nodes (a
decentralised bus has no central counter) and still exact in JSON/JCS, which cannot carry
integers above 2**53.

Every wall-clock timestamp or stored due time in bus/ and node/ is read here (:func:`now`,
:func:`now_ms`, :func:`ms_after`), so that a test can drive it with :func:`set_clock`; waits
use trio's clock (``trio.sleep``, ``move_on_after``), which the tests replace with a mock
clock. Tests that need both in step set this clock from trio's (conftest.py's
``wall_clock_on_trio``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable

MAX_ID = 2**53 - 1

_clock: Callable[[], float] = time.time


def new_id() -> int:
    return secrets.randbelow(MAX_ID) + 1


def new_nonce() -> str:
    return secrets.token_hex(16)


def now() -> int:
    """Wall-clock seconds (the spec's u32 timestamps)."""
    return int(_clock())


def now_ms() -> int:
    """Wall-clock milliseconds, from the same clock as :func:`now`."""
    return int(_clock() * 1000)


def ms_after(delay_s: float) -> int:
    """The wall-clock millisecond ``delay_s`` seconds from now (a due time to store)."""
    return int((_clock() + delay_s) * 1000)


def set_clock(clock: Callable[[], float]) -> Callable[[], float]:
    """Replace the wall clock (tests); returns the previous one."""
    global _clock
    previous, _clock = _clock, clock
    return previous
