"""Adopting, at start, what the jobs of a node that died finished without it.

A job process outlives its node (it runs in its own session) and writes its outcome, tied to
its attempt, into ``run/outcomes`` (node/slot/outcomes.py). At the next start:

* the orphan killer spares a process whose pid file names the outcome file of a job's current
  attempt (:func:`kill_orphans_but_adoptable`): it is worth waiting for;
* each runner slot, for each job it left ``started`` (node/runners/recovery.py: recover_slot),
  adopts the outcome of the job's current attempt if one was written; if the process still
  runs, it waits for its exit (a pidfd, no polling) and adopts then; only a job whose process
  is gone with no outcome is ``runner_lost``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from bus.core.attempts import Outcome, outcome_of
from bus.core.models import JobStatus, Message, RunnerJob
from bus.core.reasons import Reason
from bus.errors import ContentError, ModelError, StoreError
from bus.store import records
from bus.store.atomic import runs_trio, slots
from node.slot import outcomes
from node.slot.outcomes import (
    kill_orphans,
    live_processes,
    outcome_dir,
    parse_outcome_name,
    read_outcome,
)
from node.state import NodeState

log = logging.getLogger(__name__)

LOST = Outcome(JobStatus.ERROR, {}, f"{Reason.RUNNER_LOST}: its runner ended while it ran")


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
        status, current = await runs_trio.attempt_state(node.store, ctx, job_key)
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
    if isinstance(recorded.get("reason"), str):  # killed by its runner (a stop, a timeout)
        return Adopted(Outcome(JobStatus.ERROR, {}, recorded["reason"]), found=True)
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


@dataclass(frozen=True)
class LeftBehind:
    """A job a dead run of the node left ``started``."""

    job: RunnerJob
    request: Message
    fields: dict[str, str]
    attempt: int
    path: Path  # where its current attempt writes its outcome
    logs: tuple[Path, Path]  # the slot's log files, which a command job's output went to


# How the runner concludes an attempt (node/runners/recovery.py: conclude), given here so that
# this module does not import the runner that imports it.
Conclude = Callable[[NodeState, int, LeftBehind, Outcome, str], Awaitable[None]]


async def recover_slot(
    node: NodeState,
    ctx: int,
    inflight: str,
    queue: str,
    logs: tuple[Path, Path],
    conclude: Conclude,
) -> list[Callable[[], Awaitable[None]]]:
    """For each job of the slot's in-flight lists left ``started``: conclude it with the outcome
    its current attempt recorded, or ``runner_lost`` if its process is gone without one; one
    whose process still runs is set aside (``<inflight>:adopting``, looked at again after
    another crash) and returned as a task that waits for the process, then adopts its outcome.
    The rest of the in-flight list goes back to the queue."""
    adopting = f"{inflight}:adopting"
    pending: list[Callable[[], Awaitable[None]]] = []
    for where in (adopting, inflight):
        for job_key in await records.entries(node.store, ctx, where):
            left = await _left_behind(node, ctx, job_key, logs)
            if left is None:
                if where == adopting:  # ended meanwhile
                    await node.store.ack(ctx, adopting, job_key)
                continue
            pid = await trio.to_thread.run_sync(process_of, node, left.path)
            if pid is None:
                await _adopt(node, ctx, left, where, conclude)
                continue
            log.info("%s: attempt %d still runs (pid %d); adopting it", job_key, left.attempt, pid)
            if where == inflight:
                await slots.hand_over(node.store, ctx, job_key, inflight, adopting)
            pending.append(partial(_adopt_at_exit, node, ctx, left, adopting, pid, conclude))
    await node.store.recover(ctx, inflight, queue)
    return pending


async def _left_behind(
    node: NodeState, ctx: int, job_key: str, logs: tuple[Path, Path]
) -> LeftBehind | None:
    """A job left ``started`` (None if it is not, or cannot be read: a hostile entry is
    requeued with the rest and refused alone when popped)."""
    try:
        fields = await records.read_job(node.store, ctx, job_key)
        if fields.get("status") != JobStatus.STARTED.value:
            return None
        job = RunnerJob.from_hash(fields)
        request = Message.from_hash(await records.read_message(node.store, ctx, job.message_key))
        attempt = int(fields.get("attempt") or 0)
    except (ContentError, ModelError, ValueError):
        return None
    path = outcomes.outcome_path(node.config.run_dir, ctx, job_key, attempt)
    return LeftBehind(job, request, fields, attempt, path, logs)


async def _adopt_at_exit(
    node: NodeState, ctx: int, left: LeftBehind, inflight: str, pid: int, conclude: Conclude
) -> None:
    await wait_exit(pid)
    (pid_dir(node) / str(pid)).unlink(missing_ok=True)
    await _adopt(node, ctx, left, inflight, conclude)


async def _adopt(
    node: NodeState, ctx: int, left: LeftBehind, inflight: str, conclude: Conclude
) -> None:
    """Conclude the attempt a dead run of the node left ``started``: with the outcome its
    process recorded, or ``runner_lost`` if it recorded none."""
    found = adopted_outcome(left.path, left.logs, node.config.max_output_bytes)
    if found.found:
        key, attempt = left.job.key, left.attempt
        log.warning("%s: outcome of attempt %d adopted (its runner had gone)", key, attempt)
        node.counters.count("outcomes_adopted")
    else:
        log.warning("%s lost its runner (its process or node ended while it ran)", left.job.key)
    await conclude(node, ctx, left, found.outcome, inflight)
    await node.store.ack(ctx, inflight, left.job.key)  # a refused end leaves no entry behind
    outcomes.discard(left.path)
