"""``hero-node job submit`` and ``job wait``: fail fast on what the node would refuse or cannot
deliver, then follow the job: its output live, its progress on a terminal, its exit code.

Before anything is written, the submission is checked against what this node knows: the
context must be one it serves (it never reads another context's ``msg_out``), the message
must be one it can parse (``--timeout`` > 0), the script within its ``max_script_bytes``, and
a job that runs here of a type it has runners for. A job for a peer whose link is down is queued
all the same (the outbox keeps it until the link is back), and the user is told so at once.
Whatever the node still refuses reaches the waiting client through its reply list at once
(node/intake/messages.py), with the reason.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bus.core.models import JobStatus, Message
from bus.errors import ClientError
from crypto import load_signing_key_file
from node.cli.common import config_of, context_of, unless_interrupted
from node.cli.registry import peer_facts
from node.errors import NodeError

if TYPE_CHECKING:
    import trio

    from bus.client.api import Client, JobResult
    from node.config import NodeConfig

LOG_GRACE_S = 2.0  # after the result: how long the live output may take to print its rest
PROGRESS_EVERY_S = 1.0  # a terminal's progress line is redrawn this often
# A job for a peer whose link is down waits for its ack deadline (client.submit_job's
# timeout_ack_s), after which its node answers timeout_ack: wait that long, and a margin.
ACK_WAIT_S = 120 + 60


def positive_int(value: str) -> int:
    """An argparse type: an integer above 0 (a timeout the node accepts)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {number}")
    return number


def check_job(config: NodeConfig, script: str, script_type: str, local: bool) -> None:
    """NodeError for a job this node's own checks would refuse: a script above its
    ``max_script_bytes`` (``oversize``) or, for a job that runs here, a type it has no runner
    for (``unknown_script_type``)."""
    size = len(script.encode("utf-8", "replace"))
    if size > config.max_script_bytes:
        raise NodeError(
            f"the script has {size} bytes; this node accepts at most {config.max_script_bytes} "
            "(max_script_bytes)"
        )
    if local and script_type not in config.runners:
        known = ", ".join(sorted(config.runners))
        raise NodeError(f"this node runs no {script_type!r} jobs (its types: {known}; --type)")


async def preflight(client: Client, context: int, to: str) -> str:
    """Raise NodeError for a submission this node cannot carry out; returns a note for the user
    ("" if none) about a destination that will not be reached soon."""
    served = await client.store.context_ids()
    if context not in served:
        have = ", ".join(map(str, served)) or "none"
        raise NodeError(
            f"this node serves no context {context} (it serves: {have}); create it with "
            f"hero-node context add {context} --executor ACTOR, or pass --context"
        )
    if to == await client.node_id():
        return ""
    peer = next((p for p in await peer_facts(client) if p["id"] == to), None)
    if peer is None or peer["link"] == "up":
        return ""
    name = peer["name"] or to[:16]
    if peer["link"] == "down":
        since = time.strftime("%H:%M:%S", time.localtime(int(str(peer["since"]))))
        why = f" ({peer['error']})" if peer["error"] else ""
        return f"queued for peer {name}: link down since {since}{why}; sent when it is back"
    return f"queued for peer {name}: no link to it since the node started; sent once it links"


async def job_submit(client: Client, args: argparse.Namespace) -> int:
    config = config_of(args)
    script = args.script if args.script is not None else read_script(args.file)
    env = dict(parse_env(item) for item in args.env)
    key = load_signing_key_file(args.key_file or config.actor_key_path)
    to = await client.resolve_node(args.to)
    context = context_of(args)
    check_job(config, script, args.script_type, local=to == await client.node_id())
    note = await preflight(client, context, to)
    message = await client.submit_job(
        key,
        args.actor or config.actor_id,
        to=to,
        context_id=context,
        script_type=args.script_type,
        script=script,
        env_vars=env,
        timeout_s=args.timeout,
    )
    job_key = message.job[0].key
    if note:
        print(f"hero-node: {job_key}: {note} (hero-node msg status {message.key})", file=sys.stderr)
    if not args.wait:
        print(job_key)
        return 0
    return await follow_job(client, message, args.timeout + (ACK_WAIT_S if note else 30))


async def job_wait(client: Client, args: argparse.Namespace) -> int:
    """``job wait KEY``: re-attach to a job, print its output (live where it runs here) and
    exit with its exit code; the job's reply is not consumed (its hash says when it is over)."""
    ctx = context_of(args)
    job = await client.job_fields(ctx, args.key)
    if not job:
        raise NodeError(f"no {args.key} in context {ctx}")
    stuck = await never_runs(client, config_of(args), ctx, job)
    if stuck:
        raise NodeError(f"{args.key} waits in its queue and will not run: {stuck}")
    follower = Follower(client, ctx, args.key)
    outcome = await unless_interrupted(
        follower.until_final, f"waiting for {args.key} (Ctrl-C stops waiting, not the job)"
    )
    if outcome is None:
        print(f"hero-node: stopped waiting; {args.key} goes on", file=sys.stderr)
        return 130
    return report(outcome, follower)


async def never_runs(client: Client, config: NodeConfig, ctx: int, job: dict[str, str]) -> str:
    """Why ``job``, queued on this node, will never run ("" if it may): this node runs no job of
    its type, as it can build no sandbox (a job queued before it started so: one admitted
    since is answered isolation_refused at once, node/intake/admission.py)."""
    from bus.store import records

    if job.get("status") != JobStatus.DISPATCHED.value or job.get("pending"):
        return ""
    info = await records.node_info(client.store)
    if info.get("isolation") != "refused" or not config.runners.get(job.get("script_type", "")):
        return ""
    message = await records.read_message(client.store, ctx, job.get("message_key", ""))
    if message.get("destination") != info.get("id"):
        return ""  # it runs on another node: its result comes from there
    fix = f"; to run jobs here: {info['isolation_fix']}" if info.get("isolation_fix") else ""
    return f"this node runs no job: {info.get('isolation_why', '')}{fix}"


async def follow_job(client: Client, message: Message, timeout_s: float) -> int:
    job_key = message.job[0].key
    follower = Follower(client, message.context_id, job_key)

    async def wait() -> JobResult:
        return await follower.with_result(message, timeout_s)

    result = await unless_interrupted(
        wait, f"waiting for {job_key} (Ctrl-C stops waiting, not the job)"
    )
    if result is None:
        print(
            f"hero-node: stopped waiting; {job_key} goes on (message {message.key}): "
            f"hero-node job wait {job_key}",
            file=sys.stderr,
        )
        return 130
    return report(result, follower)


def report(result: JobResult, follower: Follower) -> int:
    """Print what the live output did not, and the exit code: the script's own when it ran
    and exited non-zero, 1 for a job that failed otherwise, 0 when it finished."""
    follower.progress.clear()
    for stream, out in (("stdout", sys.stdout), ("stderr", sys.stderr)):
        text = result.result.get(stream, "")
        out.write(text[follower.printed[stream] :])
        out.flush()
    if result.ok:
        return 0
    print(f"hero-node: job {result.job_key} failed: {result.reason}", file=sys.stderr)
    try:
        code = int(result.result.get("exit_code", ""))
    except ValueError:
        return 1
    return code if 0 < code < 256 else 1


@dataclass
class Progress:
    """A one-line ``<job>: <status>, <elapsed>`` on stderr, redrawn in place on a terminal."""

    job_key: str
    tty: bool = field(default_factory=lambda: sys.stderr.isatty())
    started: float = field(default_factory=time.monotonic)
    shown: bool = False

    def show(self, status: str) -> None:
        if not self.tty:
            return
        elapsed = int(time.monotonic() - self.started)
        sys.stderr.write(f"\r\x1b[K{self.job_key}: {status}, {elapsed} s")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self.shown = False


class Follower:
    """Follows one job: its live output (the node's log stream, see node/slot/outcomes.py),
    printed as it comes, a progress line on a terminal, and its end."""

    def __init__(self, client: Client, ctx: int, job_key: str) -> None:
        self.client, self.ctx, self.job_key = client, ctx, job_key
        self.printed = {"stdout": 0, "stderr": 0}  # characters written live, per stream
        self.progress = Progress(job_key)
        self.status = "queued"

    async def with_result(self, message: Message, timeout_s: float) -> JobResult:
        """The job's result from its reply list, its output printed live meanwhile. Output
        that began live is let finish (for up to LOG_GRACE_S) so that it stays in order; the
        rest, and the output of a job that never published live, comes from the result."""
        import trio

        async with trio.open_nursery() as nursery:
            done = trio.Event()
            nursery.start_soon(self._stream, done)
            nursery.start_soon(self._tick)
            [result] = await self.client.wait_results(message, timeout_s=timeout_s)
            if any(self.printed.values()):
                with trio.move_on_after(LOG_GRACE_S):
                    await done.wait()
            nursery.cancel_scope.cancel()
        return result

    async def until_final(self) -> JobResult:
        """``job wait``: output live until the job's hash is final, then its result."""
        import trio

        from bus.client.api import JobResult

        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._tick)
            done = trio.Event()
            await self._stream(done)
            fields = await self.client.job_fields(self.ctx, self.job_key)
            nursery.cancel_scope.cancel()
        return JobResult(
            self.job_key,
            JobStatus(fields.get("status", "error")),
            json.loads(fields.get("result") or "{}"),
            fields.get("reason", ""),
        )

    async def _stream(self, done: trio.Event) -> None:
        """Print the job's output as the node publishes it; ends with the job (its stream's
        end marker, or a final hash for a job that ran elsewhere or too briefly to publish)."""
        try:
            async for stream, text in self.client.job_logs(self.ctx, self.job_key, follow=True):
                self.progress.clear()
                out = sys.stdout if stream == "stdout" else sys.stderr
                out.write(text)
                out.flush()
                self.printed[stream] = self.printed.get(stream, 0) + len(text)
        except ClientError:  # no job hash (refused before routing): its reply says why
            return
        done.set()

    async def _tick(self) -> None:
        """Redraw the progress line (a display refresh; the waits themselves are BLPOPs)."""
        import trio

        from bus.store import records

        if not self.progress.tty:
            return
        while True:
            job = await records.read_job(self.client.store, self.ctx, self.job_key)
            self.status = job.get("status", self.status)
            self.progress.show(self.status)
            await trio.sleep(PROGRESS_EVERY_S)


def read_script(path: Path) -> str:
    try:
        return sys.stdin.read() if str(path) == "-" else path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise NodeError(f"cannot read {path}: {exc}") from None


def parse_env(item: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name:
        raise NodeError(f"--env wants NAME=VALUE, got {item!r}")
    return name, value
