"""The dead-letter watcher of one DB: each new dead letter goes to the ``on_dead_letter`` hook,
and the dlq is kept within ``dlq_max_len`` by archiving its oldest entries under the home.

Every writer of a dead letter also pushes it on ``dlq_events`` (bus/store/connection.py, the Lua
scripts
that dead-letter); the watcher pops that list reliably, so each entry reaches the hook at least
once (again after a crash between the hook and the ack). The archive is written (and synced)
before the entries leave the dlq, so a crash may archive an entry twice but never lose one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import subprocess
from pathlib import Path
from typing import NoReturn

import trio

from bus.core import keys
from bus.core.text import printable
from bus.store import records
from bus.store.atomic import queues
from bus.store.serve import Done, Handler, Popped, Queue, serve_queue
from node.state import NodeState

log = logging.getLogger(__name__)

INFLIGHT = keys.inflight("dlq")
WAKE_S = 30.0  # the blocking pop's bound: a quiet dlq costs one command every WAKE_S
# The watcher's in-flight entries are requeued however often a restart interrupted them: the
# hook runs in a child process, it cannot poison the watcher itself.
NEVER_SET_ASIDE = 2**31


async def run_dlq_watch(
    node: NodeState, db: int, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> NoReturn:
    """Watch DB ``db``'s dead letters until cancelled. Raises StoreError (restarted by
    ``resilient``); reports started once what a previous run left in flight is requeued and
    the dlq trimmed to its bound."""
    queue = Queue(
        db,
        keys.DLQ_EVENTS,
        INFLIGHT,
        read=False,
        timeout_s=WAKE_S,
        max_redeliveries=NEVER_SET_ASIDE,
    )
    await serve_queue(node.store, queue, DeadLetters(node, db), task_status=task_status)


class DeadLetters(Handler[None]):
    """Each new dead letter: the dlq is bounded first (whoever the hook tells finds it within
    its bound), then the hook runs; a hook's failure is its own (logged, counted)."""

    name = "dlq"

    def __init__(self, node: NodeState, db: int) -> None:
        self.node, self.db = node, db

    async def recovered(self) -> None:
        await trim(self.node, self.db)

    async def each(self, popped: Popped) -> Done:
        await trim(self.node, self.db)
        if self.node.config.on_dead_letter:
            await run_hook(self.node, self.db, popped.value)
        return Done.ACK


async def trim(node: NodeState, db: int) -> int:
    """Archive and drop the dlq's entries beyond its bound, oldest first; how many."""
    limit, store = node.config.dlq_limit(db), node.store
    oldest = await records.dlq_beyond(store, db, limit)
    if not oldest:
        return 0
    path = archive_path(node.config.archive_dir, db)
    await trio.to_thread.run_sync(append_lines, path, oldest)
    dropped = await queues.trim_dead(store, db, oldest)
    node.counters.count("dlq_archived", dropped)
    log.info("dlq of db %d over %d entries: %d archived to %s", db, limit, dropped, path)
    return dropped


def hook_argv(command: str) -> list[str]:
    """The argv of the hook's command line, split as a shell would (no shell runs it);
    ValueError for unbalanced quotes."""
    return shlex.split(command)


def archive_path(archive_dir: Path, db: int) -> Path:
    return archive_dir / f"dlq-{db}.jsonl"


def append_lines(path: Path, lines: list[str]) -> None:
    """Append one line per entry and sync, so the entries are on disk before they are dropped."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.writelines(line.replace("\n", " ") + "\n" for line in lines)
        f.flush()
        os.fsync(f.fileno())


async def run_hook(node: NodeState, db: int, entry: str) -> bool:
    """Run the ``on_dead_letter`` command with ``entry`` (plus its ``db``) as JSON on stdin,
    killed after ``on_dead_letter_timeout_s``. Whether it succeeded; never raises for the
    command's failure (logged and counted: the dlq goes on)."""
    config = node.config
    problem = ""
    with trio.move_on_after(max(0.0, config.on_dead_letter_timeout_s)) as scope:
        try:
            done = await trio.run_process(
                hook_argv(config.on_dead_letter),
                stdin=hook_input(entry, db),
                stdout=subprocess.DEVNULL,
                capture_stderr=True,
                check=False,
                cwd=config.home,
                start_new_session=True,  # its own group: the timeout ends what it started too
                deliver_cancel=_kill_group,
            )
        except (OSError, ValueError) as exc:  # no such command, not executable, bad quoting
            problem = f"cannot start: {exc}"
        else:
            if done.returncode != 0:
                stderr = printable(done.stderr.decode("utf-8", "replace").strip(), 300)
                problem = f"exit code {done.returncode}: {stderr}"
    if scope.cancelled_caught:
        problem = f"killed after {config.on_dead_letter_timeout_s:g} s"
    if problem:
        node.counters.count("dlq_hook_failed")
        log.warning("on_dead_letter hook (db %d): %s", db, problem)
        return False
    node.counters.count("dlq_hook_ok")
    return True


async def _kill_group(process: trio.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def hook_input(entry: str, db: int) -> bytes:
    """The entry as JSON with its ``db``; an entry that is no JSON object is passed as
    ``{"entry": <text>, "db": n}``."""
    try:
        value = json.loads(entry)
    except ValueError:
        value = None
    fields = value if isinstance(value, dict) else {"entry": entry}
    return json.dumps(fields | {"db": db}).encode()
