"""Adopting, at start, what the jobs of a node that died finished without it.

A job process outlives its node (it runs in its own session) and writes its outcome, tied to
its attempt, into ``run/outcomes`` (node/runners/outcomes.py). At the next start:

* the orphan killer spares a process whose pid file names the outcome file of a job's current
  attempt (:func:`kill_orphans_but_adoptable`): it is worth waiting for;
* each runner slot, for each job it left ``started`` (node/runners/runner.py: recover_slot),
  adopts the outcome of the job's current attempt if one was written; if the process still
  runs, it waits for its exit (a pidfd, no polling) and adopts then; only a job whose process
  is gone with no outcome is ``runner_lost``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import trio

from bus.errors import StoreError
from bus.models import JobStatus
from node.runners.executor import Outcome, kill_orphans, live_processes, outcome_of
from node.runners.outcomes import outcome_dir, parse_outcome_name, read_outcome
from node.state import NodeState

log = logging.getLogger(__name__)

LOST = Outcome(JobStatus.ERROR, {}, "runner_lost: the node stopped while it ran")


def pid_dir(node: NodeState) -> Path:
    return node.config.run_dir / "jobs"


async def kill_orphans_but_adoptable(node: NodeState) -> int:
    """Kill the scripts a dead run of this node left behind, except those still running the
    current attempt of a ``started`` job (their slot adopts them), and drop outcome files no
    slot will adopt (their job was concluded, or moved on); how many scripts were killed.
    Runs at start, before any runner slot."""
    live = await trio.to_thread.run_sync(live_processes, pid_dir(node))
    keep = frozenset([o for o in set(live.values()) if o and await _current(node, o)])
    killed = await trio.to_thread.run_sync(kill_orphans, pid_dir(node), keep)
    folder = outcome_dir(node.config.run_dir)
    names = await trio.to_thread.run_sync(lambda: list(folder.glob("*")) if folder.exists() else [])
    for path in names:
        if not await _current(node, str(path)):
            path.unlink(missing_ok=True)
    return killed


async def _current(node: NodeState, outcome: str) -> bool:
    """Whether ``outcome`` names the file of a job's current, still started attempt."""
    named = parse_outcome_name(Path(outcome).name)
    if named is None:
        return False
    ctx, job_key, attempt = named
    try:
        status, current = await node.store.call(
            ctx, lambda r: r.hmget(job_key, ["status", "attempt"])
        )
    except StoreError:  # an unknown context, say: nothing to adopt it into
        return False
    return status == JobStatus.STARTED.value and current == str(attempt)


def process_of(node: NodeState, outcome: Path) -> int | None:
    """The live process (a pid) still running the attempt whose outcome file is ``outcome``."""
    for pid, named in live_processes(pid_dir(node), prune=False).items():
        if named == str(outcome):
            return pid
    return None


async def wait_exit(pid: int) -> None:
    """Until process ``pid`` (not a child of this one) has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Adopted:
    outcome: Outcome
    found: bool  # False: no outcome was written (the process died mid-run)


def adopted_outcome(path: Path, logs: tuple[Path, Path], max_output_bytes: int) -> Adopted:
    """The outcome recorded at ``path`` (its output from the file, or else from the slot's log
    files the script wrote), or ``runner_lost`` if none was."""
    recorded = read_outcome(path)
    if recorded is None:
        return Adopted(LOST, found=False)
    out, err = recorded.get("stdout"), recorded.get("stderr")
    if not isinstance(out, str) or not isinstance(err, str):
        out, err = (_head(p, max_output_bytes) for p in logs)
    return Adopted(outcome_of(recorded["exit_code"], out, err, max_output_bytes), found=True)


def _head(path: Path, limit: int) -> str:
    """What a script wrote to a log file, bounded as captured output is."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(0)
            text = f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""
    return text + (f"\n[... {size - limit} more bytes cut]" if size > limit else "")
