"""Job scripts for tests: they announce themselves on a Redis list, so a test can wait for
"the script is running" with a blocking pop instead of polling."""

from __future__ import annotations

from urllib.parse import urlsplit

import trio

_ANNOUNCE = """\
import os, socket
def _announce(where, auth, key):
    val = str(os.getpid())
    def cmd(*args):
        return b"*%d\\r\\n" % len(args) + b"".join(b"$%d\\r\\n%s\\r\\n" % (len(a), a) for a in args)
    if isinstance(where, str):
        s = socket.socket(socket.AF_UNIX)
        s.connect(where)
    else:
        s = socket.create_connection(where)
    with s:
        login = cmd(b"AUTH", *(a.encode() for a in auth)) if auth else b""
        s.sendall(login + cmd(b"SELECT", b"1") + cmd(b"LPUSH", key.encode(), val.encode()))
        s.recv(100)
"""


def announcing(redis_url: str, key: str, body: str) -> str:
    """A python script that LPUSHes its pid on ``key`` (DB 1), then runs ``body``; it connects
    to ``redis_url`` (TCP or unix socket) with the URL's credentials, if any."""
    url = urlsplit(redis_url)
    where = url.path if url.scheme == "unix" else ("127.0.0.1", url.port)
    auth = (url.username, url.password) if url.password else None
    return f"{_ANNOUNCE}_announce({where!r}, {auth!r}, {key!r})\n{body}"


async def wait_announced(store, key: str, timeout_s: float = 20) -> int:
    """The pid a script announced on ``key`` (blocking pop, bounded)."""
    with trio.fail_after(timeout_s):
        popped = await store.call(1, lambda r: r.blpop([key], timeout=timeout_s))
    assert popped is not None, f"no script announced itself on {key}"
    return int(popped[1])


def command_job_run(tmp_path, redis_url: str, command: list[str]):
    """A runner process's JobRun (node/worker/job.py) for command jobs, set up in this
    process as a runner would be (its run directory under ``tmp_path``): ``run(job)`` runs
    one job through ``command`` and returns its Outcome."""
    import os
    from pathlib import Path

    from bus.core.models import Message
    from bus.store.atomic.runs_sync import SyncRuns, connect
    from node.worker import job as procjob
    from node.worker.loop import RunnerSpec

    spec = RunnerSpec(
        redis_url, 1, "sh", 0, command, "", "n:b:1:sh:0", 15_000, str(tmp_path), 1000, 60,
        "n", False, 10,
    )  # fmt: skip
    procjob.PROCESS.base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    (Path(tmp_path) / "jobs").mkdir(parents=True, exist_ok=True)
    (Path(tmp_path) / "outcomes").mkdir(parents=True, exist_ok=True)
    jobs = procjob.JobRun(spec, SyncRuns(connect(redis_url, 1)), lambda *_: False)

    def run(job, attempt: int = 1):
        return jobs.run(job, Message(1, job.caller_id, 1, origin="n", destination="n"), attempt)

    run.job_run = jobs  # type: ignore[attr-defined]
    return run
