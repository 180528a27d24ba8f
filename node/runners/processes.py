"""The node's side of its runner processes (node/worker/loop.py): one per slot, started,
watched, restarted, recycled and ended here; nothing of a job passes through the node.

Per slot, a task in the context's nursery:

* before each start, recovers the slot (node/runners/recovery.py ``recover_slot``): the attempt
  a dead process left ``started`` is concluded with the outcome it recorded, adopted when a
  command it started ends, or ended ``runner_lost`` (and retried as its retries allow); the
  rest of the slot's in-flight list goes back to its queue;
* starts the process (its own session: a job's processes are in its group) with a socket to
  the node's signer (node/host/signer.py) and writes its spec, the ``runner`` URL with its
  password and the admission key first on its stdin (never in an environment; the key
  passphrase variable is not passed on either), then waits for its
  exit (trio waits on a pidfd: no polling); a process that exits is started again: at once
  after a recycle (exit 0 after ``RECYCLE_JOBS`` jobs), after a backoff if it keeps dying;
* starts it ``runner_nice`` steps below the node's CPU priority (:func:`lower_priority`);
* reads its reports (jobs taken, for the supervisor's backpressure, a line per
  ``taken_every`` jobs; retries scheduled, for the retry scheduler; the counters of rare
  events): a lone job's runner reports nothing, its end is in the job statistics;
* relays stop requests, wake-ups (a job queued on a priority or targeted list) and a new
  primary the Sentinels named (the process leaves the old one at once);
* at shutdown: SIGTERM when intake stops (the running job finishes; an idle process exits at
  once), SIGINT when the grace period is over (the job is killed and given back uncounted),
  SIGKILL to its process group if it still runs KILL_GRACE_S later.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import trio

from bus.core import keys
from bus.store import serve
from node.host.hardening import child_env
from node.observe import logs
from node.observe.tracing import runner_settings
from node.runners.recovery import recover_slot
from node.runners.sandboxes import slot_sandbox
from node.slot import outcomes
from node.slot.outcomes import KILL_GRACE_S, log_paths
from node.slot.spec import RunnerSpec, frame
from node.state import NodeState

log = logging.getLogger(__name__)

POP_TIMEOUT_S = 5.0  # a runner's blocking pop (bus/core/queues.py: what it may miss)
RECYCLE_JOBS = 20_000  # a process is replaced after this many jobs (what a job leaks ends)
RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0)  # after 0, 1, 2, ... quick deaths in a row
QUICK_S = 2.0  # a process that dies sooner than this after its start counts as a quick death


def runner_spec(
    node: NodeState, ctx: int, script_type: str, command: list[str], slot: int, redis_url: str
) -> RunnerSpec:
    config = node.config
    return RunnerSpec(
        url=redis_url,
        ctx=ctx,
        script_type=script_type,
        slot=slot,
        command=command,
        group=config.runner_groups.get(script_type, ""),
        token_base=f"{node.identity.node_id[:12]}:{node.identity.boot}:{ctx}:{script_type}:{slot}",
        lease_ttl_ms=config.lease_ttl_ms,
        run_dir=str(config.run_dir),
        max_output_bytes=config.max_output_bytes,
        reply_ttl_s=config.reply_ttl_s,
        node_id=node.identity.node_id,
        in_process=script_type == "python" and config.python_workers,
        max_jobs=RECYCLE_JOBS,
        pop_timeout_s=POP_TIMEOUT_S,
        breaker_failures=config.type_breaker_failures,
        breaker_open_ms=int(config.type_breaker_open_s * 1000),
        breaker_probes=config.type_breaker_probes,
        # the supervisor waits for a batch's worth of jobs taken: report twice per batch
        taken_every=max(1, min(16, serve.BATCH // 2)),
        batch_jobs=config.batch_jobs,
        log_level=logging.getLogger().getEffectiveLevel(),
        log_format=logs.current_format(),
        sandbox=slot_sandbox(config, node.runners.isolation, ctx) if node.runners.isolation else {},
        tracing=runner_settings(),
    )


class RunnerProcess:
    """One running runner process: what the node can tell it."""

    def __init__(self, proc: trio.Process, token_base: str) -> None:
        self.proc = proc
        self.token_base = token_base  # names the attempts it starts (node/state.py LiveRunner)
        self.up = trio.Event()  # it reported ``up``: set up, about to pop

    def signal(self, signum: int) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    def cancel(self) -> None:
        """A wake-up (``WakeUps.wake_idle_slots``): a blocking pop looks at every list."""
        self.signal(signal.SIGUSR1)

    def primary_moved(self) -> None:
        """The Sentinels named a new primary: the process shuts its connections to the old one
        (SIGUSR2; before ``up`` it has no handler for it, nor any connection yet)."""
        if self.up.is_set():
            self.signal(signal.SIGUSR2)

    def stop(self, job_key: str, reason: str) -> None:
        """Ask it to stop ``job_key`` if it runs it."""
        self.send({"stop": job_key, "reason": reason})

    def send(self, request: dict[str, object]) -> None:
        """A request on its control pipe (rare: stops, an abort; never per job)."""
        stdin = self.proc.stdin
        if stdin is None or self.proc.returncode is not None:
            return
        line = json.dumps(request).encode() + b"\n"
        with contextlib.suppress(OSError):
            os.write(stdin.fileno(), line)  # type: ignore[attr-defined]  # a pipe's FdStream


async def run_runner_process(
    node: NodeState,
    ctx: int,
    script_type: str,
    command: list[str],
    slot: int,
    redis_url: str,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Keep slot ``slot`` of ``script_type`` served by a runner process until cancelled."""
    if node.shutdown.stopping.is_set():
        # a slot of a staged start reached after the node began to stop: nothing to serve,
        # and its starter (nursery.start) must not take the return for a crash
        task_status.started()
        return
    spec = runner_spec(node, ctx, script_type, command, slot, redis_url)
    logs = log_paths(node.config.run_dir, f"{ctx}-{spec.slot_id}")
    outcomes.outcome_dir(node.config.run_dir).mkdir(parents=True, exist_ok=True)
    quick = launches = 0
    async with trio.open_nursery() as adoptions:
        while not node.shutdown.stopping.is_set():
            # the slot's process has ended (one a dead node left writes its attempt's own file)
            await trio.to_thread.run_sync(
                outcomes.unpack_slot, node.config.run_dir, ctx, spec.slot_id
            )
            for adopt in await recover_slot(
                node, ctx, spec.inflight, keys.queue(script_type), logs
            ):
                adoptions.start_soon(adopt)
            began = trio.current_time()
            # each process of the slot has tokens of its own: a reaper that finds a lapsed
            # lease renews it only for the process that started the attempt, and one a
            # predecessor left (its recovery's end lost in a failover) is ended
            launch = replace(spec, token_base=f"{spec.token_base}:{launches}")
            launches += 1
            code = await _serve_once(node, launch, task_status)
            task_status = trio.TASK_STATUS_IGNORED
            if node.shutdown.stopping.is_set():
                break
            quick = quick + 1 if code != 0 and trio.current_time() - began < QUICK_S else 0
            if code != 0:
                node.counters.count("runner_restarts")
                log.warning(
                    "runner %s (context %d) exited with %s; restarting", spec.slot_id, ctx, code
                )
            await trio.sleep(RESTART_BACKOFF_S[min(quick, len(RESTART_BACKOFF_S) - 1)])
        adoptions.cancel_scope.cancel()


async def _serve_once(node: NodeState, spec: RunnerSpec, task_status: trio.TaskStatus[None]) -> int:
    """Start the process, watch it until it exits (returned: its exit code)."""
    marker = secrets.token_hex(8)
    env = child_env() | {"HERO_WORKER": marker}
    signer = await node.identity.signer.attach() if node.identity.signer is not None else None
    if signer is not None:
        spec = replace(spec, signer_fd=signer.fileno())
    try:  # the run directory on its command line: what names the node's runners in ps
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "node.worker", "--runner", spec.run_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
            env=env,
            pass_fds=() if signer is None else (signer.fileno(),),
        )
    finally:
        if signer is not None:
            signer.close()
    assert proc.stdin is not None
    # before its spec: the process waits for it, so no thread of it runs at the old priority
    lower_priority(proc.pid, node.config.runner_nice)
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        await proc.stdin.send_all(
            frame(spec, node.identity.admission_key)
        )  # dead at once: seen below
    handle = RunnerProcess(proc, spec.token_base)
    where = (spec.ctx, spec.slot_id)
    wakers = node.wakeups.idle_slots.setdefault((spec.ctx, spec.script_type), set())
    node.runners.processes[where] = handle
    wakers.add(handle)
    node.shutdown.job_started()  # a live runner counts as running until it exits (graceful stop)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_reports, node, spec.ctx, proc, handle.up)
            with trio.CancelScope() as starting:
                nursery.start_soon(_cancel_at_exit, proc, starting)
                await handle.up.wait()  # started: a job queued now finds a process ready for it
            task_status.started()
            await _wait(node, handle)
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await _end(handle)
        node.runners.processes.pop(where, None)
        wakers.discard(handle)
        node.shutdown.job_ended()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # what its jobs left in its group
        (Path(spec.run_dir) / "jobs" / str(proc.pid)).unlink(missing_ok=True)
    return proc.returncode if proc.returncode is not None else -signal.SIGKILL


def lower_priority(pid: int, steps: int) -> None:
    """Run process ``pid`` (a runner that leads a session of its own, not yet threaded)
    ``steps`` nice values below this process, as far as 19; the job processes it starts inherit
    it. Where the kernel groups each session's processes (autogroup: CPU is shared between the
    groups first, each with its group's nice), the group's nice is lowered too; a session shared
    with the node is left alone (it would lower the node).

    Why: a stream of local jobs is paced by the node's intake (and its clients), which each
    wait for a core about half the time they could run while the runners take it
    (bench/HISTORY.md#case1-idle). Below the node, a runner runs when intake has had its turn,
    and takes what queued meanwhile in one batch: fewer wake-ups, less CPU per job. On an idle
    machine nothing waits for a core and nothing changes. Best effort: a kernel that refuses
    (a container's limits, no autogroup) leaves the priority as it is."""
    if steps <= 0:
        return
    with contextlib.suppress(OSError):
        own = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, pid, min(19, own + steps))
    with contextlib.suppress(OSError, ValueError, IndexError):
        group = Path(f"/proc/{pid}/autogroup").read_text().split()
        mine = Path("/proc/self/autogroup").read_text().split()
        if group[0] != mine[0]:
            Path(f"/proc/{pid}/autogroup").write_text(str(min(19, int(mine[-1]) + steps)))


async def _wait(node: NodeState, handle: RunnerProcess) -> None:
    """Until the process exits; when intake stops, it is told to drain (SIGTERM)."""
    with trio.CancelScope() as intake:
        node.shutdown.intake.add(intake)
        try:
            if node.shutdown.stopping.is_set():
                intake.cancel()
            await handle.proc.wait()
            return
        finally:
            node.shutdown.intake.discard(intake)
    handle.signal(signal.SIGTERM)
    await handle.proc.wait()


async def _end(handle: RunnerProcess) -> None:
    """Cancelled (the grace period is over): abort the job (SIGINT), then SIGKILL. A process
    that has not reported ``up`` has taken nothing: it is killed at once (a SIGINT while its
    interpreter starts would print a KeyboardInterrupt traceback on the node's stderr)."""
    if handle.proc.returncode is not None:
        return
    if not handle.up.is_set():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(handle.proc.pid, signal.SIGKILL)
        await handle.proc.wait()
        return
    handle.send({"abort": True})  # a python job's attempt is given back by the watch thread
    handle.signal(signal.SIGINT)
    with trio.move_on_after(KILL_GRACE_S + 1):
        await handle.proc.wait()
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(handle.proc.pid, signal.SIGKILL)
    await handle.proc.wait()


async def _cancel_at_exit(proc: trio.Process, scope: trio.CancelScope) -> None:
    await proc.wait()
    scope.cancel()


async def _read_reports(node: NodeState, ctx: int, proc: trio.Process, up: trio.Event) -> None:
    """The process's report lines: ``up`` (ready), ``t<n>`` jobs taken, ``c{json}`` counters
    (stale_results, batch_takes, jobs_not_admitted), ``r`` a retry scheduled."""
    assert proc.stdout is not None
    buffer = b""
    while chunk := await proc.stdout.receive_some(4096):
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.startswith(b"t") and line[1:].isdigit():
                for _ in range(int(line[1:])):
                    node.backpressure.job_taken()
            elif line.startswith(b"c"):
                _count(node, line[1:])
            elif line == b"r":
                node.wakeups.wake_retries(ctx)
            elif line == b"up":
                up.set()


def _count(node: NodeState, raw: bytes) -> None:
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        for name, n in json.loads(raw).items():
            node.counters.count(str(name), int(n))


RunnerSlot = tuple[str, list[str], int]  # script type, command, slot number


def slots_of(node: NodeState, script_types: dict[str, list[str]]) -> list[RunnerSlot]:
    """(script type, command, slot) of every local runner process of a context."""
    return [
        (t, command, slot)
        for t, command in script_types.items()
        for slot in range(node.config.runners[t])
    ]


def start_stages(slots: list[RunnerSlot], *, staged: bool) -> list[list[RunnerSlot]]:
    """The order a context's runner processes are started in. ``staged`` (a context created
    while the node runs, whose first job may be waiting): each type's first slot, then the
    others once those are up. A start is ~0.5 s of CPU (a fresh interpreter importing the
    runner, then its sandbox): six started at once on two cores came up together after ~3.5 s,
    and the context's first job waited for all of them, not for the one it needs. Not staged
    (the node's start, which reports ready once every runner is up, after recovering what
    each slot left in flight): all at once."""
    if not staged:
        return [slots] if slots else []
    stages = [[s for s in slots if s[2] == 0], [s for s in slots if s[2] > 0]]
    return [stage for stage in stages if stage]


async def start_in_stages(
    slots: list[RunnerSlot],
    start: Callable[[RunnerSlot], Awaitable[object]],
    *,
    staged: bool,
) -> None:
    """``start`` each slot (it returns once that slot's process is up): a stage's together,
    the next stage once the whole stage is up (:func:`start_stages`)."""
    for stage in start_stages(slots, staged=staged):
        async with trio.open_nursery() as starting:
            for slot in stage:
                starting.start_soon(start, slot)
