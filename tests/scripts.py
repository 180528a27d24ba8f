"""Job scripts for tests: they announce themselves on a Redis list, so a test can wait for
"the script is running" with a blocking pop instead of polling."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import trio

_ANNOUNCE = """\
import ctypes, os, socket
def _announce(where, auth, key):
    # named after a token of its own (the test finds it from outside the sandbox's pid
    # namespace, by that name): unique on the host, so tests running beside each other never
    # find each other's scripts
    name = "hj-" + os.urandom(6).hex()
    ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
    val = "%d %s" % (os.getpid(), name)
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
    """A python script that names itself after ``key`` and LPUSHes its pid on ``key`` (DB 1),
    then runs ``body``; it connects to ``redis_url`` (TCP or unix socket) with the URL's
    credentials, if any (its context must be allowed the network)."""
    url = urlsplit(redis_url)
    where = url.path if url.scheme == "unix" else ("127.0.0.1", url.port)
    auth = (url.username, url.password) if url.password else None
    return f"{_ANNOUNCE}_announce({where!r}, {auth!r}, {key!r})\n{body}"


async def wait_announced(store, key: str, timeout_s: float = 20, *, sandboxed: bool = True) -> int:
    """The pid, as this machine sees it, of the script that announced itself on ``key``
    (blocking pop, bounded). A job's announced pid is its sandbox's: it is found by its name;
    ``sandboxed=False`` (a hook the node runs itself): the pid it announced."""
    with trio.fail_after(timeout_s):
        popped = await store.call(1, lambda r: r.blpop([key], timeout=timeout_s))
    assert popped is not None, f"no script announced itself on {key}"
    pid, name = str(popped[1]).split()
    if not sandboxed:
        return int(pid)
    found = named(name)
    # never 0: a caller may signal it (os.killpg(0, ...) is the caller's own group)
    assert len(found) == 1, f"{key}: the announcing process is gone or not alone: {found}"
    return found[0]


def named(comm: str) -> list[int]:
    """The live processes whose name (``/proc/<pid>/comm``) is ``comm``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            name = (entry / "comm").read_text().strip()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if name == comm and state != "Z":
            found.append(int(entry.name))
    return found


def work_file(node, name: str, context: int = 1) -> Path:  # noqa: ANN001 - a test node
    """Where a job of ``context`` on ``node`` finds ``name`` (its cwd): a sandboxed job writes
    only its context's work dir, ``<home>/work/<context>``."""
    return Path(node.config.home) / "work" / str(context) / name


SH = ["/bin/sh", "-s"]  # the command of command_job_run's sh jobs: the script on stdin


def sh_job(ident: int, script: str):  # noqa: ANN201 - a RunnerJob, imported lazily as below
    """A sh job numbered ``ident`` of context 1, for :func:`command_job_run` with :data:`SH`."""
    from bus.core.models import RunnerJob

    return RunnerJob(1, ident, 1, script, "sh", timeout=60)


def command_job_run(tmp_path, redis_url: str, command: list[str]):
    """A runner process's JobRun (node/worker/job.py) for command jobs, set up in this
    process as a runner would be (its run directory under ``tmp_path``): ``run(job)`` runs
    one job through ``command`` and returns its Outcome."""
    import os
    from dataclasses import asdict
    from pathlib import Path

    from bus.core.models import Message
    from bus.store.atomic.runs_sync import SyncRuns, connect
    from node.sandbox.probe import probe, sandbox_spec
    from node.worker import job as procjob
    from node.worker.loop import RunnerSpec

    iso = probe("auto", Path(tmp_path) / "home", "bwrap", Path(tmp_path) / "work", 2_000_000_000)
    box = asdict(sandbox_spec(iso, Path(tmp_path) / "work", 1, 2_000_000_000, {}, True, 1000))
    spec = RunnerSpec(
        redis_url, 1, "sh", 0, command, "", "n:b:1:sh:0", 15_000, str(tmp_path), 1000, 60,
        "n", False, 10, sandbox=box,
    )  # fmt: skip
    procjob.PROCESS.base_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    (Path(tmp_path) / "jobs").mkdir(parents=True, exist_ok=True)
    (Path(tmp_path) / "outcomes").mkdir(parents=True, exist_ok=True)
    jobs = procjob.JobRun(spec, SyncRuns(connect(redis_url, 1)), lambda *_: False)

    def run(job, attempt: int = 1):
        request = Message(1, job.caller_id, 1, origin="n", destination="n")
        return jobs.run(job, request, attempt, spec.token(job.key))

    run.job_run = jobs  # type: ignore[attr-defined]
    return run
