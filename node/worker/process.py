"""A built-in runner process, from its start to its exit: ``python -m node.worker --runner``
(node/worker/__main__.py) loads this module and runs :func:`main`, which serves one slot's loop
(node/worker/loop.py) until it is drained, recycled or aborted.

One process per runner slot (``[runners] python = N``: N processes per context), started,
watched and restarted by the node (node/runners/processes.py). It holds no secret it does not
need: it connects as the ``runner`` ACL user (node/host/acl.py), gets its spec (that URL with
its password) and the admission key over its stdin pipe, never in its environment, is not
dumpable, and has the results of remote requests signed by the node's signer process
(node/host/signer.py) over an inherited socket: the node key is not in this process.

Signals from the node: SIGTERM drains (no new job; the running one finishes), SIGINT aborts
(the running job is killed and given back uncounted), SIGUSR1 wakes a blocking pop to look at
every list (a priority or targeted job was queued), SIGUSR2 says the Sentinels named a new
primary: every connection to the old one is shut at once (``SyncRuns.cut``), so that no
command waits on a primary that stalled and none reaches it when it wakes up still taking
writes (its replicas gone, but not yet noticed): a cut end is sent again and lands on the
new primary, a cut pop or start ends the process for the node's recovery of the slot.

The node's death drains too (its end of the control pipe closes; not PR_SET_PDEATHSIG, which
fires when the thread that forked exits, and trio forks from a worker thread): a job that
outlives its node finishes and answers, then the process exits.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType, TracebackType
from typing import Any

from bus.store.atomic.runs_sync import SyncStoreError
from node.host.hardening import not_dumpable
from node.host.heap import freeze_start_heap
from node.host.signer import SignerClient
from node.observe.logs import configure
from node.slot.spec import RunnerSpec, read_frame
from node.worker.ending import report, runner_fields
from node.worker.job import Wake, prepare_process
from node.worker.loop import SlotLoop

log = logging.getLogger("node.worker.loop")

__all__ = ["log_to", "main"]


_RUNNER: SlotLoop | None = None


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    runner = _RUNNER
    if runner is None:
        return
    if signum == signal.SIGUSR2:  # the primary moved: the blocked call fails on its own
        runner.runs.cut()
        return
    if signum in (signal.SIGTERM, signal.SIGINT):
        runner.flags.draining = True
    if signum == signal.SIGINT:
        runner.job.abort()
    if runner.flags.popping:
        runner.flags.popping = False
        raise Wake


def main() -> None:
    """``python -m node.worker --runner``: the spec first on stdin (node/slot/spec.py)."""
    global _RUNNER
    not_dumpable()  # before the frame: the password and key never sit in a readable process
    try:
        spec, admission_key = read_frame(0)
    except EOFError:  # the node stopped (or died) before it wrote the spec: nothing to serve
        os._exit(0)
    log_to(os.dup(2), spec)  # fd 2 becomes a python job's capture file
    signer = SignerClient(spec.signer_fd) if spec.signer_fd >= 0 else None
    prepare_process(spec)  # fds, subreaper, pid file, environment
    _RUNNER = runner = SlotLoop(spec, admission_key, signer)
    provider = _traced(spec)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, _on_signal)
    if runner.reports.orphaned():
        return
    runner.job.start_watch()
    frozen = freeze_start_heap()
    report(b"up")
    up = runner_fields(spec)
    log.info(
        "runner %s (context %d) up, pid %d (start-up heap frozen: %d objects)",
        spec.slot_id,
        spec.ctx,
        os.getpid(),
        frozen,
        extra=up,
    )
    try:
        runner.runs.set_breaker(
            spec.script_type, spec.breaker_failures, spec.breaker_open_ms, spec.breaker_probes
        )
        runner.reports.totals = runner.runs.slot_totals(spec.slot_id)
        runner.serve()
    except SyncStoreError as exc:  # a pop or a start whose outcome is unknown: the node's
        # recovery of the slot knows (it requeues the popped entry, ends the started attempt)
        log.error("runner %s lost Valkey (%r); exiting", spec.slot_id, exc, extra=up)
        runner.job.sandbox.stop(graceful=True)
        _flush(provider)
        os._exit(2)
    # no job runs now: the sandbox ends as a retired one does, reaped here with its jobs' CPU
    # (not left to bwrap's die-with-parent and init, which would count it nowhere)
    runner.job.sandbox.stop(graceful=True)
    _flush(provider)
    os._exit(0)  # the watch and export threads are daemons; nothing else to wait for


def _traced(spec: RunnerSpec) -> Any:  # noqa: ANN401 - a TracerProvider, or None
    """The process's tracer provider when its node traces (node/worker/spans.py), else None:
    the recorder (node/observe/recorder.py) is imported only then."""
    if not spec.tracing:
        return None
    from node.observe.tracing import install_runner

    return install_runner(spec.tracing)


def _flush(provider: Any) -> None:  # noqa: ANN401
    """Send the spans still queued before the process exits (os._exit runs no atexit)."""
    if provider is not None:
        provider.shutdown()


def log_to(fd: int, spec: RunnerSpec) -> None:
    """Log to ``fd`` (the node's stderr) in the spec's level and format, uncaught exceptions
    too: a traceback printed as it is would break a stream of JSON lines in pieces."""
    stream = os.fdopen(fd, "w", buffering=1, encoding="utf-8", errors="backslashreplace")
    configure(spec.log_level, spec.log_format, stream)
    fields = runner_fields(spec)

    def uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        log.critical("runner %s failed", spec.slot_id, exc_info=(kind, exc, tb), extra=fields)

    def uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
        if args.exc_value is not None:
            uncaught(args.exc_type, args.exc_value, args.exc_traceback)

    sys.excepthook = uncaught
    threading.excepthook = uncaught_in_thread
