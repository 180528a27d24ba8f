"""The job statistics a runner process counts itself (``stats:jobs``, read by
node/observe/metrics.py), with the very field names and labels
``bus/store/atomic/lua/stats_jobs.lua`` uses. Pure, no I/O: the counting and the text handed to
the scripts, which apply it.

A script that ends an attempt counts it in Valkey, whichever process runs it. A runner process
ends thousands of attempts a second between them, and those counts cost it ~13 commands per job
inside its scripts (TIME, re-reads of the job, one HINCRBY per figure). So it counts them here,
in its memory, and hands them to one of its ending scripts (``stats`` ARGV: the script then
counts nothing itself and applies these), at most every ``taken_every`` jobs and always when it
runs out of work: in the same script as the answer to the last job, so that whoever waited for
that answer reads figures that include it.

What it hands over is its slot's running totals (:meth:`StatsBatch.handover`): one ``HSET`` of
the field ``runner|<slot id>`` (a JSON object), not one ``HINCRBY`` per figure, and a hand-over
whose reply was lost is not counted twice. The next process of the slot starts from that
field's totals (:func:`totals_of`), and a reader adds every such field to the plain ones
(:func:`merged_fields`). The node counts what its own scripts count the same way, in its
field ``node|<node id>`` (node/observe/tallies.py). A runner whose node died (another
process of its slot may be running) hands over increments instead
(:meth:`StatsBatch.encode`), which the scripts add to the plain fields.

Durations are not compared across clocks: a duration is the runner's own monotonic interval from
the start of the attempt to its end; a round trip adds the interval the job waited, between the
two stamps Valkey's clock put on the job (``stats_queued_ms``, ``stats_started_ms``).
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from dataclasses import dataclass, field

import orjson

__all__ = [
    "NODE_FIELD",
    "STATS_BUCKETS_S",
    "RUNNER_FIELD",
    "StatsBatch",
    "merged_fields",
    "reason_token",
    "totals_of",
    "type_label",
]

# Upper bounds (s) of the job duration and round-trip histograms (node/observe/metrics.py;
# stats_jobs.lua's buckets): from a local python job (milliseconds) to a long batch job (an hour).
STATS_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
RUNNER_FIELD = "runner|"  # + a slot id: that slot's runner processes' totals (a JSON object)
NODE_FIELD = "node|"  # + a node id: what that node's own scripts counted (node/observe/tallies.py)
_TOTALS = (RUNNER_FIELD, NODE_FIELD)

# as stats_jobs.lua's patterns: %w is ASCII alphanumerics in Valkey's C locale
_TYPE = re.compile(r"[A-Za-z0-9_.\-]*")
_TOKEN = re.compile(r"[a-z0-9_]*")


def type_label(script_type: str) -> str:
    """A job's script type as a label (stats_type): cut at the first character no [runners]
    name has, at most 64 characters."""
    return _label(script_type[:64])


def reason_token(text: str) -> str:
    """A reason's token (stats_token): its text up to the first character no token has."""
    return _token(text[:40])


# A runner counts every job it ends with the same few labels (its type, "finished", no
# reason): they are remembered, not matched again per job; by the prefix that decides them,
# so that free-text reasons keep the cache small.
@functools.lru_cache(maxsize=256)
def _label(prefix: str) -> str:
    m = _TYPE.match(prefix)
    return m.group(0) if m else ""


@functools.lru_cache(maxsize=256)
def _token(prefix: str) -> str:
    m = _TOKEN.match(prefix)
    return m.group(0) if m else ""


_BOUNDS = [(bound, str(bound)) for bound in STATS_BUCKETS_S]


def _bucket(seconds: float) -> str:
    for bound, label in _BOUNDS:
        if seconds <= bound:
            return label
    return "+Inf"


def _stamp(fields: dict[str, str], name: str) -> int | None:
    value = fields.get(name, "")
    return int(value) if value.isdigit() else None


@dataclass
class StatsBatch:
    """Counts not yet in ``stats:jobs``: field -> increment (a ``_sum`` field is a float)."""

    counts: Counter[str] = field(default_factory=Counter)
    sums: dict[str, float] = field(default_factory=dict)
    jobs: int = 0  # attempts counted since the batch was last applied

    def _observe(self, name: str, stype: str, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.counts[f"{name}|{stype}|{_bucket(seconds)}"] += 1
        key = f"{name}_sum|{stype}"
        self.sums[key] = self.sums.get(key, 0.0) + seconds

    def started(self, fields: dict[str, str], n: int = 1) -> None:
        """``n`` attempts of a job with ``fields`` (as its start returned them) started here,
        by a script told not to count them (stats_jobs.lua's ``started|<type>``)."""
        self.counts[f"started|{type_label(fields.get('script_type', ''))}"] += n

    def ended(self, fields: dict[str, str], status: str, reason: str, duration_s: float) -> None:
        """An attempt of the job with ``fields`` (as its start returned them) ended here
        (stats_ended): ``status`` finished, error or retry; a retry's reason is its cause,
        the reason of the attempt that failed."""
        stype = type_label(fields.get("script_type", ""))
        self.counts[f"ended|{stype}|{reason_token(status)}|{reason_token(reason)}"] += 1
        self._observe("duration", stype, duration_s)
        self.jobs += 1

    def answered(self, fields: dict[str, str], status: str, reason: str, duration_s: float) -> None:
        """The job was answered here, where it was submitted (stats_answered): its round trip
        is the wait between its two stamps plus the attempt's ``duration_s``."""
        stype = type_label(fields.get("script_type", ""))
        self.counts[f"answered|{stype}|{reason_token(status)}|{reason_token(reason)}"] += 1
        queued, started = _stamp(fields, "stats_queued_ms"), _stamp(fields, "stats_started_ms")
        if queued is not None and started is not None:
            self._observe("roundtrip", stype, (started - queued) / 1000 + duration_s)

    def merged(self, other: StatsBatch) -> StatsBatch:
        """A batch holding both (a count that is not above zero is left out, as ``Counter``
        addition leaves it)."""
        counts = dict(self.counts)
        for k, n in other.counts.items():
            counts[k] = counts.get(k, 0) + n
        sums = dict(self.sums)
        for k, v in other.sums.items():
            sums[k] = sums.get(k, 0.0) + v
        kept = Counter({k: n for k, n in counts.items() if n > 0})
        return StatsBatch(kept, sums, self.jobs + other.jobs)

    def copy(self) -> StatsBatch:
        """A batch holding the same (to add to, this one unchanged)."""
        return StatsBatch(Counter(self.counts), dict(self.sums), self.jobs)

    def encode(self) -> str:
        """The ``stats`` ARGV of an ending script: a JSON list ``[field, increment, ...]``
        (strings; a ``_sum|`` field is added with HINCRBYFLOAT, any other with HINCRBY)."""
        flat: list[str] = []
        for k, n in self.counts.items():
            flat += [k, str(n)]
        for k, s in self.sums.items():
            flat += [k, repr(s)]
        return orjson.dumps(flat).decode()

    def add_flat(self, flat: list[str]) -> None:
        """Add what a script counted for its caller (stats_jobs.lua: stats_collected,
        ``[field, increment, ...]``)."""
        for name, value in zip(flat[0::2], flat[1::2], strict=False):
            self._add(name, value)

    def _add(self, name: str, value: object) -> None:
        """Add ``value`` to figure ``name``, unless it is none a figure holds (_figure)."""
        figure = _figure(name, value)
        if isinstance(figure, float):
            self.sums[name] = self.sums.get(name, 0.0) + figure
        elif figure is not None:
            self.counts[name] += figure

    def figures(self) -> dict[str, int | float]:
        """Every figure of the batch: field -> count, or seconds for a ``_sum|`` field."""
        return {**self.counts, **self.sums}

    def handover(self, slot_id: str) -> str:
        """The ``stats`` ARGV that sets the slot's field to this batch, taken as the slot's
        totals (stats_apply: ``=<field>\t<JSON object>``, one HSET)."""
        return f"={RUNNER_FIELD}{slot_id}\t" + orjson.dumps(self.figures()).decode()


def _figure(name: str, value: object) -> int | float | None:
    """``value`` as the figure ``name`` holds (a whole count, or a finite number of seconds
    for a ``_sum|`` field), or None if it is not one: stats:jobs is written by runner
    processes, and a reader skips what none of them should have written."""
    if isinstance(value, bytes | str):
        try:
            value = float(value) if "_sum|" in name else int(value)
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if "_sum|" in name:
        return float(value) if math.isfinite(value) else None
    return value if isinstance(value, int) else None


def totals_of(encoded: str | bytes | None) -> StatsBatch:
    """A slot's totals as its field holds them (:meth:`StatsBatch.handover`); empty for no
    field, and for one that is not such an object (it is then written over)."""
    try:
        decoded = orjson.loads(encoded or b"{}")
    except orjson.JSONDecodeError:
        return StatsBatch()
    batch = StatsBatch()
    if not isinstance(decoded, dict):
        return batch
    for name, value in decoded.items():
        if not name.startswith(_TOTALS):
            batch._add(name, value)
    return batch


def merged_fields(stats: dict[str, str]) -> dict[str, str]:
    """``stats:jobs`` as one set of figures: its plain fields plus every slot's totals
    (``runner|<slot id>``), each figure a decimal string; a value no runner or script should
    have written is left out."""
    out: dict[str, int | float] = {}
    for name, value in stats.items():
        if name.startswith(_TOTALS):
            figures: dict[str, int | float] = totals_of(value).figures()
        else:
            figure = _figure(name, value)
            figures = {} if figure is None else {name: figure}
        for key, n in figures.items():
            out[key] = out.get(key, 0) + n
    return {k: repr(v) if isinstance(v, float) else str(v) for k, v in out.items()}
