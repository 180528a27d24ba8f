"""The circuit breaker of each script type of a context, kept in Valkey (``type_breakers``).

A type's runners are several processes (node/worker/loop.py), so its breaker is shared: one
hash per context DB, changed only by Lua (``lua/type_breaker.lua``, bus/core/breaker.py's
state machine transcribed), by the very scripts that start and end attempts, whichever process
runs them. The job path pays no round trip for it: ``runs_take_next`` and ``runs_start`` refuse
to start a job of a type whose breaker is open (and say for how long), and every script that
ends an attempt tells the breaker how it ended (:func:`verdict`). Times are Valkey's clock
(``TIME``): every process that reads or changes a breaker sees one clock.

Which attempts count: ``finished`` is a success (closes it); ``error`` (or a retried failure)
is a failure, unless its reason is a refusal or a stop (:data:`bus.store.atomic.BREAKER_NEUTRAL`):
a non-zero exit, a timeout, a lost runner, a command that cannot start all count. An attempt
given back at shutdown is no verdict either; a probe that ends so frees its place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bus.core import keys
from bus.store.atomic import BREAKER_NEUTRAL, script

if TYPE_CHECKING:
    from bus.store.connection import Store

__all__ = [
    "BREAKER_OPEN",
    "BreakerOpen",
    "TypeBreaker",
    "apply_event",
    "config_value",
    "open_wait",
    "parse",
    "read",
    "verdict",
]

BREAKER_OPEN = "breaker_open"  # runs_start's answer for a type whose breaker is open: '<this>:<ms>'


@dataclass(frozen=True)
class BreakerOpen:
    """A start refused by the type's breaker: no job of the type may start for ``wait_ms``."""

    wait_ms: int


@dataclass(frozen=True)
class TypeBreaker:
    """One type's breaker as read: its settings, its state at Valkey's ``now_ms``."""

    threshold: int
    open_ms: int
    probes: int
    failures: int = 0
    opened_ms: int | None = None
    probing: int = 0
    now_ms: int = 0

    @property
    def state(self) -> str:
        """closed, open or half_open (bus/core/breaker.py ``BreakerState``)."""
        if self.opened_ms is None:
            return "closed"
        return "open" if self.now_ms < self.opened_ms + self.open_ms else "half_open"

    def to_json(self) -> dict[str, Any]:
        """What ``status --json`` shows: state, failures in a row, probes under way, and while
        not closed when it opened (Unix s) and the seconds until probes may go."""
        out: dict[str, Any] = {
            "state": self.state,
            "failures": self.failures,
            "probing": self.probing,
        }
        if self.opened_ms is not None:
            out["opened_at"] = self.opened_ms // 1000
            out["probe_in_s"] = round(max(0, self.opened_ms + self.open_ms - self.now_ms) / 1000, 1)
        return out


def open_wait(answer: object) -> int | None:
    """The wait (ms) in a start's or a take's answer ``breaker_open:<ms>``, else None (a
    reason token never looks like it)."""
    text = answer.decode() if isinstance(answer, bytes) else str(answer)
    gate, _, wait_ms = text.partition(":")
    digits = wait_ms.isascii() and wait_ms.isdigit()
    return int(wait_ms) if gate == BREAKER_OPEN and digits else None


def config_value(threshold: int, open_ms: int, probes: int) -> str:
    """The ``<type>|cfg`` field: threshold 0 turns the type's breaker off."""
    return f"{max(0, threshold)},{max(0, open_ms)},{max(1, probes)}"


def verdict(status: str, reason: str) -> str:
    """How an ended attempt counts (``type_breaker_ended`` in Lua): 'ok', 'fail' or '' (none).
    ``status`` is finished, error, retry (a failure retried: ``reason`` its cause) or
    requeued (given back)."""
    token = ""
    for ch in reason:
        if not (ch.isascii() and (ch.islower() or ch.isdigit() or ch == "_")):
            break
        token += ch
    if status == "finished":
        return "ok"
    if status in ("error", "retry") and token not in BREAKER_NEUTRAL:
        return "fail"
    return ""


def parse(fields: dict[str, str], now_ms: int) -> dict[str, TypeBreaker]:
    """The breakers a ``type_breakers`` hash holds, by script type (those with a threshold)."""
    out: dict[str, TypeBreaker] = {}
    for name, value in fields.items():
        script_type, _, what = name.rpartition("|")
        if what != "cfg":
            continue
        try:
            threshold, open_ms, probes = (int(x) for x in value.split(","))
        except ValueError:
            continue
        if threshold < 1:
            continue
        opened = fields.get(f"{script_type}|opened_ms", "")
        out[script_type] = TypeBreaker(
            threshold,
            open_ms,
            max(1, probes),
            failures=_int(fields.get(f"{script_type}|failures")),
            opened_ms=int(opened) if opened.isdigit() else None,
            probing=_int(fields.get(f"{script_type}|probing")),
            now_ms=now_ms,
        )
    return dict(sorted(out.items()))


def _int(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0


async def read(store: Store, ctx: int) -> dict[str, TypeBreaker]:
    """Every script type's breaker of context ``ctx``, at Valkey's time. Raises StoreError."""
    flat = await store.script(ctx, script("type_breakers_read"), [keys.TYPE_BREAKERS], [])
    items = [x.decode() if isinstance(x, bytes) else str(x) for x in flat]
    fields = {items[i]: items[i + 1] for i in range(1, len(items) - 1, 2)}
    return parse(fields, int(items[0]))


async def apply_event(
    store: Store, ctx: int, script_type: str, event: str, now_ms: int, job_key: str = ""
) -> int:
    """One event on the breaker of ``script_type`` at ``now_ms``, as the scripts that end
    (``ok``, ``fail``, ``release``) and start (``take``, of ``job_key``) attempts apply them at
    Valkey's time; the wait (ms) before a job may start after it, or -1 if a ``take`` may not
    start now. For tests that drive the time, and an operator's ``ok`` (closing a breaker).
    Raises StoreError."""
    args = [script_type, event, str(now_ms), job_key]
    return int(await store.script(ctx, script("type_breaker_event"), [], args))
