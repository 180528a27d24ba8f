"""A warm sandboxed worker (node/sandbox/inner.py ``--warm``, the default): python jobs of a
context run one after another in one process, and every per-job guarantee that still applies
in a shared process holds per job; what a job leaves that the next one must not meet gets the
next one a fresh process (docs/security/sandbox.md#warm-sandboxes).

Each test has its control: the same probe shows the process was shared where nothing was left.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from crypto import read_key_file
from node.sandbox.host import Sandbox
from node.sandbox.inner import _replace_environ
from node.sandbox.spawn import SandboxLost
from node.slot.outcomes import Ending, limit_reason
from tests.sandbox.test_sandbox import _box, _cmdline, _run, needs_root

pytestmark = needs_root

# the job process's identity across jobs: a value only a process that ran an earlier job holds
MARK = (
    "import builtins, os\n"
    "print(getattr(builtins, 'hero_mark', None), os.getpid())\n"
    "builtins.hero_mark = os.urandom(8).hex()\n"
)


def _marks(box: Sandbox, tmp_path: Path) -> tuple[str, str]:
    """(the mark an earlier job left, this process's pid)."""
    reply, out, err = _run(box, tmp_path, MARK, "python")
    assert reply["exit_code"] == 0, err
    mark, pid = out.split()
    return mark, pid


def test_python_jobs_share_a_process_and_each_gets_its_own_cwd_env_umask_and_output(
    tmp_path: Path,
) -> None:
    box, _ = _box(tmp_path, "strict")
    spoil = (
        "import os\nos.chdir('/tmp'); os.umask(0); os.environ['LEFT'] = '1'\n"
        "import sys; sys.path.append('/nowhere'); sys.stdout = open(os.devnull, 'w')\n"
        "print('lost')\n"
    )
    check = (
        "import os, sys\nprint(os.getcwd(), oct(os.umask(0o077)), 'LEFT' in os.environ,"
        " os.environ['OWN'], '/nowhere' in sys.path)\n"
        "print('to stderr', file=sys.stderr)\n"
    )
    try:
        _marks(box, tmp_path)
        reply, out, _ = _run(box, tmp_path, spoil, "python", OWN="a")
        assert (reply["exit_code"], out) == (0, "")
        reply, out, err = _run(box, tmp_path, check, "python", OWN="b")
        mark, _pid = _marks(box, tmp_path)
    finally:
        box.stop()
    assert reply["exit_code"] == 0, err
    assert out == "/job 0o77 False b False\n"
    assert err == "to stderr\n"  # its own, not an earlier job's
    assert mark != "None"  # the control: one process ran all four


@pytest.mark.parametrize(
    ("script", "code", "signum"),
    [
        ("import os\nos._exit(3)", 3, 0),
        ("import ctypes\nctypes.string_at(0)", None, signal.SIGSEGV),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", None, signal.SIGKILL),
    ],
    ids=["os_exit", "crash", "killed"],
)
def test_a_job_that_ends_the_process_is_answered_for_and_the_next_gets_a_new_one(
    tmp_path: Path, script: str, code: int | None, signum: int
) -> None:
    box, _ = _box(tmp_path, "strict")
    try:
        _marks(box, tmp_path)
        worker = box.pid
        reply, out, _ = _run(box, tmp_path, "print('partial', flush=True)\n" + script, "python")
        after, _pid = _marks(box, tmp_path)
        same_sandbox = box.pid == worker
    finally:
        box.stop()
    assert (reply["exit_code"], reply["signal"]) == (code, signum)
    assert out == "partial\n"
    assert after == "None"  # a new process
    assert same_sandbox  # forked by the same worker: no new sandbox


def test_sys_exit_ends_the_job_not_the_process(tmp_path: Path) -> None:
    box, _ = _box(tmp_path, "strict")
    try:
        _marks(box, tmp_path)
        reply, _, _ = _run(box, tmp_path, "import sys\nsys.exit(4)", "python")
        after, _ = _marks(box, tmp_path)
    finally:
        box.stop()
    assert reply["exit_code"] == 4
    assert after != "None"


LEFT_BEHIND = {
    "thread": "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()",
    "raw_thread": "import _thread, time\n_thread.start_new_thread(time.sleep, (60,))",
    "open_file": "import os\nos.open(os.devnull, os.O_RDONLY)",
    "alarm": "import signal\nsignal.alarm(60)",
    "handler": "import signal\nsignal.signal(signal.SIGTERM, lambda *a: None)",
    "limit": "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (16, 16))",
    "closed_stdout": "import sys\nsys.stdout.close()",
    # a thread, hidden: the process's own stat file, which its worker holds open and reads per
    # job, swapped for a forged one that says one thread (the swap itself is what is seen)
    "hidden_thread": (
        "import os, threading, time\n"
        "me = f'/proc/{os.getpid()}/stat'\n"
        "links = {n: f'/proc/self/fd/{n}' for n in os.listdir('/proc/self/fd')}\n"
        "held = [int(n) for n, p in links.items() if os.path.exists(p) and os.readlink(p) == me]\n"
        "head, tail = open(me, 'rb').read().rsplit(b')', 1)\n"
        "fields = tail.split()\n"
        "fields[17] = b'1'\n"
        "forged = os.open('/tmp/stat', os.O_RDWR | os.O_CREAT, 0o600)\n"
        "os.write(forged, head + b') ' + b' '.join(fields) + b'\\n')\n"
        "for fd in held:\n"
        "    os.dup2(forged, fd)\n"
        "os.close(forged)\n"
        "threading.Thread(target=time.sleep, args=(60,)).start()\n"
        "print(len(held))\n"
    ),
}


@pytest.mark.parametrize("left", sorted(LEFT_BEHIND))
def test_what_a_job_leaves_in_its_process_gets_the_next_job_a_fresh_one(
    tmp_path: Path, left: str
) -> None:
    box, _ = _box(tmp_path, "strict")
    try:
        _marks(box, tmp_path)
        reply, _, err = _run(box, tmp_path, LEFT_BEHIND[left], "python")
        after, _ = _marks(box, tmp_path)
        control, _ = _marks(box, tmp_path)
    finally:
        box.stop()
    assert reply["exit_code"] == 0, err
    assert after == "None"
    assert control != "None"  # a job that leaves nothing keeps the process


def test_what_a_python_job_leaves_running_is_killed(tmp_path: Path) -> None:
    box, _ = _box(tmp_path, "strict")
    naps = [f"30{i}.{secrets.randbelow(10**6):06d}" for i in (1, 2, 3)]  # no other test's
    script = (
        "import subprocess\n"
        f"subprocess.Popen(['setsid', 'sh', '-c', 'sleep {naps[0]} & sleep {naps[1]}'])\n"
        f"subprocess.Popen(['sleep', '{naps[2]}'])\n"
    )
    try:
        _marks(box, tmp_path)
        reply, _, err = _run(box, tmp_path, script, "python")
        procs = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
        ours = {f"sleep\0{nap}\0".encode() for nap in naps}
        left = [c for p in procs if (c := _cmdline(p)) in ours]
        after, _ = _marks(box, tmp_path)
    finally:
        box.stop()
    assert reply["exit_code"] == 0, err
    assert left == []
    assert after != "None"  # killing them did not cost the process


def test_a_python_job_at_its_cpu_limit_ends_with_cpu_limit_and_the_next_runs(
    tmp_path: Path,
) -> None:
    """The process's CPU limit counts its whole life, so it is replaced once it used
    CPU_BUDGET_S: a job after one that used more still gets its own cpu_s less at most that
    (SIGXCPU); one that raises its soft limit is SIGKILLed at the hard one, as in a process of
    its own."""
    box, _ = _box(tmp_path, "strict", cpu_s=1)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6:\n    pass\n"
    spin = "while True:\n    pass\n"
    raise_it = (
        "import resource\nr = resource.RLIMIT_CPU\n"
        "resource.setrlimit(r, (resource.getrlimit(r)[1],) * 2)\n"
    )
    try:
        _marks(box, tmp_path)
        burnt, _, _ = _run(box, tmp_path, burn, "python")
        fresh, _ = _marks(box, tmp_path)
        endings = [_run(box, tmp_path, s, "python")[0] for s in (burn + spin, raise_it + spin)]
        after, _, _ = _run(box, tmp_path, "print('fine')", "python")
    finally:
        box.stop()
    assert burnt["exit_code"] == 0
    assert fresh == "None"  # the 0.6 s job used up the process's budget
    for reply in endings:
        ending = Ending(reply["exit_code"], reply["signal"], reply["cpu_s"])
        assert limit_reason(ending, box.spec.limit_values, b"", 0) == "cpu_limit", reply
    assert endings[0]["signal"] == signal.SIGXCPU
    assert endings[0]["cpu_s"] < 1.5
    assert endings[1]["signal"] == signal.SIGKILL
    assert endings[1]["cpu_s"] < 2.5
    assert after["exit_code"] == 0


def test_a_command_job_gets_its_own_cpu_limit(tmp_path: Path) -> None:
    box, _ = _box(tmp_path, "strict", cpu_s=2)
    try:
        reply, out, _ = _run(box, tmp_path, "ulimit -t; ulimit -Ht")
    finally:
        box.stop()
    assert reply["exit_code"] == 0
    assert out.split() == ["2", "3"]


def test_contexts_never_share_a_worker(tmp_path: Path) -> None:
    """Each context's slots get a sandbox of their own (one SandboxSpec per context): a mark
    one context's job leaves is never seen by another's, while the next job of the same
    context sees it (the control)."""
    one, _ = _box(tmp_path, "strict", ctx=3)
    two, _ = _box(tmp_path, "strict", ctx=4)
    try:
        _marks(one, tmp_path)
        same, _ = _marks(one, tmp_path)
        other, _ = _marks(two, tmp_path)
        uids = [box.uid for box in (one, two)]
    finally:
        one.stop()
        two.stop()
    assert same != "None"
    assert other == "None"
    assert uids[0] != uids[1]


def test_fresh_process_gives_each_python_job_its_own(tmp_path: Path) -> None:
    box, _ = _box(tmp_path, "strict", fresh=True)
    try:
        _marks(box, tmp_path)
        after, _ = _marks(box, tmp_path)
    finally:
        box.stop()
    assert after == "None"


def test_a_forged_answer_ends_the_job_not_the_runner(tmp_path: Path) -> None:
    """In a warm process a job can reach the socket to the runner: what it writes there is
    checked, and a job that is not an ending loses the sandbox, nothing more. The forged
    frame comes alone (not an ending) or, if the runner was slower than the job's end, with
    the worker's own answer behind it in one read (a job wrote there): either way."""
    box, _ = _box(tmp_path, "strict")
    forge = (
        "import json, os, socket, struct\n"
        "data = json.dumps({'exit_code': 'x'}).encode()\n"
        "for fd in range(3, 10):\n"
        "    try:\n"
        "        s = socket.socket(fileno=os.dup(fd))\n"
        "        s.sendall(struct.pack('>I', len(data)) + data)\n"
        "    except OSError:\n"
        "        pass\n"
    )
    try:
        with pytest.raises(SandboxLost, match="not an ending|a job wrote there"):
            _run(box, tmp_path, forge, "python")
        reply, out, _ = _run(box, tmp_path, "print('next')", "python")
    finally:
        box.stop()
    assert (reply["exit_code"], out) == (0, "next\n")


async def test_a_node_never_runs_two_contexts_jobs_in_one_worker(node_factory) -> None:  # noqa: ANN001
    """Through the node: runner slots are per context, and so are their warm workers. The
    second python job of context 1 meets the first one's mark (the control: one warm worker,
    one slot per context); context 2's job never does."""
    alice = await node_factory("alice", runners={"python": 1, "sh": 1})
    own = alice.config.actor_id
    await alice.client.register_context(2, admins=[own])
    actor = read_key_file(alice.config.actor_key_path)

    async def mark(ctx: int) -> str:
        msg = await alice.client.submit_job(
            actor, own, to=alice.node_id, context_id=ctx, script_type="python", script=MARK
        )
        [res] = await alice.client.wait_results(msg, 40)
        assert res.ok, res
        return res.stdout.split()[0]

    with trio.fail_after(60):
        await mark(1)
        same = await mark(1)
        other = await mark(2)
        again = await mark(1)
    assert same != "None"
    assert other == "None"
    assert again != "None"


_NAMES = st.text(alphabet="ABCDEFGHIJ_", min_size=1, max_size=3)
_ENVS = st.dictionaries(_NAMES, st.text(alphabet="abc=/ ", max_size=4), max_size=6)


@settings(max_examples=60)
@given(st.lists(_ENVS, min_size=1, max_size=4))
def test_a_jobs_environment_is_exactly_its_own(envs: list[dict[str, str]]) -> None:
    """The shared job process sets only the variables that differ from the last job's: what
    a job then finds, in os.environ and in the C environment its commands inherit, is its own
    environment and nothing of an earlier one."""
    getenv = ctypes.CDLL(None).getenv
    getenv.restype = ctypes.c_char_p
    saved = dict(os.environ)
    try:
        seen = set(saved)
        for env in envs:
            _replace_environ(env)
            seen |= set(env)
            assert dict(os.environ) == env
            for name in seen:
                value = getenv(name.encode())
                assert value == (env[name].encode() if name in env else None)
    finally:
        _replace_environ(saved)
