"""The job statistics a runner process counts itself (``stats:jobs``, read by
node/observe/metrics.py), with the very field names and labels ``lua/stats_jobs.lua`` uses.

A script that ends an attempt counts it in Valkey, whichever process runs it. A runner process
ends thousands of attempts a second between them, and those counts cost it ~13 commands per job
inside its scripts (TIME, re-reads of the job, one HINCRBY per figure). So it counts them here,
in its memory, and hands the sums to one of its ending scripts (``stats`` ARGV: the script then
counts nothing itself and applies these), at most every ``taken_every`` jobs and always when it
runs out of work: in the same script as the answer to the last job, so that whoever waited for
that answer reads figures that include it.

Durations are not compared across clocks: a duration is the runner's own monotonic interval from
the start of the attempt to its end; a round trip adds the interval the job waited, between the
two stamps Valkey's clock put on the job (``stats_queued_ms``, ``stats_started_ms``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import orjson

from bus.store.atomic import STATS_BUCKETS_S

__all__ = ["StatsBatch", "reason_token", "type_label"]

# as stats_jobs.lua's patterns: %w is ASCII alphanumerics in Valkey's C locale
_TYPE = re.compile(r"[A-Za-z0-9_.\-]*")
_TOKEN = re.compile(r"[a-z0-9_]*")
_RETRY = re.compile(r"retrying after: (.*)", re.DOTALL)


def type_label(script_type: str) -> str:
    """A job's script type as a label (stats_type): cut at the first character no [runners]
    name has, at most 64 characters."""
    m = _TYPE.match(script_type)
    return m.group(0)[:64] if m else ""


def reason_token(text: str) -> str:
    """A reason's token (stats_token): its text up to the first character no token has."""
    m = _TOKEN.match(text)
    return m.group(0)[:40] if m else ""


def _bucket(seconds: float) -> str:
    for bound in STATS_BUCKETS_S:
        if seconds <= bound:
            return str(bound)
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

    def ended(self, fields: dict[str, str], status: str, reason: str, duration_s: float) -> None:
        """An attempt of the job with ``fields`` (as its start returned them) ended here
        (stats_ended): ``status`` finished, error or retry; a retry's reason is counted as
        the reason of its attempt."""
        stype = type_label(fields.get("script_type", ""))
        if status == "retry" and (m := _RETRY.match(reason)):
            reason = m.group(1)
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
        """A batch holding both."""
        sums = dict(self.sums)
        for k, v in other.sums.items():
            sums[k] = sums.get(k, 0.0) + v
        return StatsBatch(self.counts + other.counts, sums, self.jobs + other.jobs)

    def encode(self) -> str:
        """The ``stats`` ARGV of an ending script: a JSON list ``[field, increment, ...]``
        (strings; a ``_sum|`` field is added with HINCRBYFLOAT, any other with HINCRBY)."""
        flat: list[str] = []
        for k, n in self.counts.items():
            flat += [k, str(n)]
        for k, s in self.sums.items():
            flat += [k, repr(s)]
        return orjson.dumps(flat).decode()
