"""A node asking a peer for its summary: the figures a grid view draws of each node (up or down,
queue depths, runners, counters, recent charts). The ask, the answer, their bounds and checks;
the grid's sums. Pure, no I/O.

A :class:`SummaryAsk` is written and signed by the asking *node* (its own key, domain
``summary-ask``) and carried in an ``ask`` frame ``{"ask": {...}, "of": "summary"}``; the peer
answers with one ``tell`` frame ``{"tell": {"ask", "node", "summary" | "reason", "detail"},
"of": "summary"}``. A node that does not know summaries reads the ask as a malformed trace ask
and refuses it; the asking node then waits out its bound.

Why the node and not an actor, as for a trace ask (bus/core/traces.py): a summary holds only
what any peer of the node may know, whoever runs it: totals over all its contexts (queue
depths by list name, runners by script type, node counters, the charts' series), never a
context id, a job key, a caller or a payload. The signature binds the ask to the two nodes and
to a time: the answering node checks it is by the key its link proved, for itself, and fresh,
so an ask cannot be replayed over another link. Bounds on both sides: one ask names nothing,
a summary is at most :data:`MAX_SUMMARY_BYTES` and its series at most :data:`MAX_POINTS`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bus.core import keys
from bus.core.asks import AskRefused, SignedAsk, checked_object, route_problem
from bus.core.reasons import Reason
from bus.core.verify import Freshness
from crypto import ALGORITHM_ED25519

DOMAIN_SUMMARY = "summary-ask"
MAX_POINTS = 120  # points per series: the sampler's ring (node/observe/sampler.py)
MAX_NAMES = 64  # entries of one map (depths, counters, runner types, series of a chart)
MAX_NAME_CHARS = 80
MAX_SUMMARY_BYTES = 64 * 1024  # a summary bigger than this is refused as oversize
MAX_ASK_BYTES = 2 * 1024

FIGURES = ("queued", "dead_letters", "runners", "busy")  # whole numbers of a summary
CHART_GROUPS = ("rates", "latency_ms", "depths")

_V = TypeVar("_V")
_NAME = re.compile(r"[A-Za-z0-9_:.|+-]{1,80}")  # MAX_NAME_CHARS


@dataclass(frozen=True)
class SummaryAsk(SignedAsk):
    """What node ``node`` asks node ``target``: its summary, now."""

    DOMAIN = DOMAIN_SUMMARY

    id: int
    node: str
    target: str
    created_at: int
    nonce: str
    signatures: tuple[Mapping[str, str], ...] = field(default=(), compare=False)


def parse_summary_ask(obj: object) -> SummaryAsk:
    """A :class:`SummaryAsk` from its wire object; AskRefused(malformed) naming what is wrong."""
    if isinstance(obj, dict):
        extra = set(obj) - {"id", "node", "target", "created_at", "nonce", "signatures"}
        if extra:
            raise AskRefused(Reason.MALFORMED, f"summary ask field {sorted(extra)[0][:40]!r}")
    checked = checked_object(obj, "summary ask", ("id", "created_at"))
    return SummaryAsk(
        checked["id"],
        checked["node"],
        checked["target"],
        checked["created_at"],
        checked["nonce"],
        tuple(checked["signatures"]),
    )


def summary_ask_problem(
    ask: SummaryAsk, *, link_peer: str, own_id: str, now: int, max_age_s: int, max_skew_s: int
) -> AskRefused | None:
    """What the answering node refuses in a summary ask (None if nothing): it names the node
    its link proved, is for this node, is fresh, and is signed by that node's key."""
    fresh = Freshness(max_age_s=max_age_s, max_skew_s=max_skew_s)
    refused = route_problem(ask, link_peer=link_peer, own_id=own_id, now=now, freshness=fresh)
    return refused or ask.signature_problem(link_peer, ALGORITHM_ED25519)


# -- the summary -------------------------------------------------------------------------------


def summarise(
    depths: Mapping[str, int],
    runners: Mapping[str, tuple[int, int]],
    counters: Mapping[str, int],
    links: Mapping[str, int],
    charts: Mapping[str, Any],
) -> dict[str, Any]:
    """A node's summary: ``depths`` by list name summed over its contexts (``dlq`` the dead
    letters, the rest queued), ``runners`` script type -> (live, busy), its ``counters``,
    ``links`` (``up``, ``down``: its peers' links) and its charts (sampler.series; {} if it
    samples nothing). Bounded to :data:`MAX_NAMES` entries a map, :data:`MAX_POINTS` a series;
    ``finished_per_s`` and ``roundtrip_p99_ms`` are the charts' newest points."""
    rates = charts.get("rates", {}).get("finished", []) if charts else []
    p99 = charts.get("latency_ms", {}).get("roundtrip_p99", []) if charts else []
    return {
        "queued": sum(n for name, n in depths.items() if name != keys.DLQ),
        "dead_letters": depths.get(keys.DLQ, 0),
        "runners": sum(live for live, _ in runners.values()),
        "busy": sum(busy for _, busy in runners.values()),
        "finished_per_s": rates[-1] if rates else None,
        "roundtrip_p99_ms": p99[-1] if p99 else None,
        "depths": _first(depths),
        "runner_types": {t: list(v) for t, v in _first(runners).items()},
        "counters": _first(counters),
        "links": {"up": links.get("up", 0), "down": links.get("down", 0)},
        "charts": _bounded_charts(charts),
    }


def _first(values: Mapping[str, _V]) -> dict[str, _V]:
    """The first MAX_NAMES entries whose name a peer accepts (a summary with one it would not
    is refused whole)."""
    named = [(k, v) for k, v in sorted(values.items()) if _NAME.fullmatch(k)]
    return dict(named[:MAX_NAMES])


def _bounded_charts(charts: Mapping[str, Any]) -> dict[str, Any]:
    if not charts:
        return {}
    out: dict[str, Any] = {"every_s": charts.get("every_s", 0), "at": charts["at"][-MAX_POINTS:]}
    for group in CHART_GROUPS:
        columns = list(sorted(charts.get(group, {}).items()))[:MAX_NAMES]
        out[group] = {name: column[-MAX_POINTS:] for name, column in columns}
    return out


def summary_problem(obj: object) -> str:
    """Why a told summary is not one the grid can draw ("" if it is): a peer is an
    authenticated node, not a trusted one."""
    if not isinstance(obj, dict):
        return "summary is not an object"
    for name in FIGURES:
        if not _count(obj.get(name)):
            return f"{name!r} must be a whole number >= 0"
    for name in ("finished_per_s", "roundtrip_p99_ms"):
        if obj.get(name) is not None and not _number(obj.get(name)):
            return f"{name!r} must be a number or null"
    for name in ("depths", "counters", "links"):
        problem = _map_problem(obj.get(name), _count)
        if problem:
            return f"{name!r}: {problem}"
    problem = _map_problem(
        obj.get("runner_types"),
        lambda v: isinstance(v, list) and len(v) == 2 and all(_count(n) for n in v),
    )
    if problem:
        return f"'runner_types': {problem}"
    return _charts_problem(obj.get("charts"))


def _charts_problem(charts: object) -> str:
    if charts == {}:
        return ""
    if not isinstance(charts, dict) or set(charts) - {"every_s", "at", *CHART_GROUPS}:
        return "'charts' must be an object of every_s, at, rates, latency_ms and depths"
    if not _number(charts.get("every_s")):
        return "'charts.every_s' must be a number"
    if not _column(charts.get("at"), nulls=False):
        return f"'charts.at' must be a list of up to {MAX_POINTS} numbers"
    for group in CHART_GROUPS:
        nulls = group == "latency_ms"
        problem = _map_problem(charts.get(group, {}), lambda v, n=nulls: _column(v, nulls=n))
        if problem:
            return f"'charts.{group}': {problem}"
    return ""


def _map_problem(value: object, good: Any) -> str:  # noqa: ANN401 - a predicate
    if not isinstance(value, dict) or len(value) > MAX_NAMES:
        return f"an object of up to {MAX_NAMES} entries"
    for name, entry in value.items():
        if not _NAME.fullmatch(name) or not good(entry):
            return f"bad entry {str(name)[:40]!r}"
    return ""


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _number(value: object) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    return math.isfinite(value) and value >= 0


def _column(value: object, *, nulls: bool) -> bool:
    return (
        isinstance(value, list)
        and len(value) <= MAX_POINTS
        and all(_number(v) or (nulls and v is None) for v in value)
    )


# -- the grid ----------------------------------------------------------------------------------


def grid_charts(charts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The grid's charts from its nodes' (each sampler.series-shaped, newest points aligned):
    rates and depths summed; latency the worst node's, as quantiles of different nodes do not
    add (a grid p99 is at most the worst node's p99). Times are the first node's. {} if no
    node has charts."""
    drawn = [c for c in charts if c and c.get("at")]
    if not drawn:
        return {}
    points = max(len(c["at"]) for c in drawn)
    out: dict[str, Any] = {
        "every_s": drawn[0].get("every_s", 0),
        "at": _aligned([c["at"] for c in drawn], points, max),
        "rates": {},
        "latency_ms": {},
        "depths": {},
    }
    for group, combine in (("rates", _sum), ("latency_ms", max), ("depths", _sum)):
        names = sorted({n for c in drawn for n in c.get(group, {})})
        for name in names:
            columns = [c[group][name] for c in drawn if name in c.get(group, {})]
            out[group][name] = _aligned(columns, points, combine)
    return out


def _sum(values: Sequence[float]) -> float:
    return round(sum(values), 3)


def _aligned(columns: Sequence[Sequence[Any]], points: int, combine: Any) -> list[Any]:  # noqa: ANN401
    """Columns combined point by point, aligned at their newest ends; None where no column
    has a value."""
    out: list[Any] = []
    for back in range(points, 0, -1):
        values = [c[-back] for c in columns if back <= len(c) and c[-back] is not None]
        out.append(combine(values) if values else None)
    return out
