"""The sandbox of every job (node/sandbox): its planning as plain functions, then real bwrap
sandboxes (node/sandbox/host.py) that show what a job can and cannot do, each property next
to the same job with isolation "none", where it does not hold (the control)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import secrets
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus.core.reasons import Reason
from node.sandbox import seccomp
from node.sandbox.cgroups import UNIFIED
from node.sandbox.host import Sandbox
from node.sandbox.limits import Limits, LimitsError, limits_for, parse_limits
from node.sandbox.plan import (
    HostFacts,
    PlanError,
    SandboxPlan,
    bwrap_argv,
    check_binds,
    collapse,
    resolve_mode,
)
from node.sandbox.probe import probe, sandbox_spec
from node.sandbox.settings import (
    ContextSandbox,
    SandboxSettingsError,
    context_settings,
    parse_sandbox,
)
from node.sandbox.spawn import SandboxLost, SandboxSpec, recycle_point, spawn
from node.slot.outcomes import Ending, limit_reason

BASE = 2_000_000_000
ROOT = Path(__file__).resolve().parents[2]

# -- planning ---------------------------------------------------------------------------------


def _plan(**kw: object) -> SandboxPlan:
    values: dict[str, object] = {
        "mode": "strict", "bwrap": "bwrap", "setpriv": "setpriv", "work_dir": "/h/work/3",
        "worker": ["py", "inner.py"], "binds": ["/opt/py"], "uid": BASE + 3,
    } | kw  # fmt: skip
    return SandboxPlan(**values)  # type: ignore[arg-type]


FACTS = HostFacts({"/usr": None, "/bin": "usr/bin", "/lib64": "usr/lib64"})


@pytest.mark.parametrize("mode", ["strict", "namespaces"])
def test_the_plan_never_binds_root_and_isolates(mode: str) -> None:
    argv = bwrap_argv(_plan(mode=mode), FACTS)
    pairs = list(zip(argv, argv[1:], strict=False))
    assert ("--ro-bind", "/") not in pairs
    assert ("--bind", "/") not in pairs
    for flag in ("--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net"):
        assert flag in argv
    assert ("--bind", "/h/work/3") in pairs  # the one writable bind
    assert [a for a in argv if a == "--bind"] == ["--bind"]
    assert ("--symlink", "usr/bin") in pairs
    assert ("--unshare-user" in argv) is (mode == "namespaces")
    if mode == "strict":
        assert f"--reuid={BASE + 3}" in argv
        assert "--no-new-privs" in argv
        assert "--bounding-set=-all" in argv
        assert "--clear-groups" in argv


@pytest.mark.parametrize("mode", ["strict", "namespaces"])
def test_a_checkout_under_tmp_is_bound_over_the_tmpfs(mode: str) -> None:
    """bwrap mounts in argument order: the tmpfs on /tmp comes before every bind, or a project
    (and the interpreter of its virtualenv) checked out under /tmp is hidden and no job runs."""
    argv = bwrap_argv(_plan(mode=mode, binds=["/tmp/ci/.venv", "/opt/py"]), FACTS)
    tmpfs = argv.index("--tmpfs")
    assert argv[tmpfs + 1] == "/tmp"
    bound = [i for i, a in enumerate(argv) if a == "--ro-bind" and argv[i + 1] == "/tmp/ci/.venv"]
    made = [i for i, a in enumerate(argv) if a == "--dir" and argv[i + 1] == "/tmp/ci"]
    assert bound
    assert made
    assert tmpfs < made[0] < bound[0]


def test_a_context_with_network_keeps_it() -> None:
    assert "--unshare-net" not in bwrap_argv(_plan(network=True), FACTS)


def test_strict_without_root_switches_uid_before_bwrap() -> None:
    argv = bwrap_argv(_plan(as_root=False), FACTS)
    assert argv[0] == "setpriv"
    assert argv.index("bwrap") > argv.index("--no-new-privs")
    assert "--unshare-user" in argv
    assert "--bind-fd" in argv


def test_a_bind_that_exposes_the_home_is_refused() -> None:
    # the fix named is the one that applies: a home inside the checkout moves, a virtualenv
    # inside the home moves out (a newcomer's home made inside the clone met the second)
    with pytest.raises(PlanError, match="give the node a home outside /root "):
        check_binds(["/root"], ["/root/.hero-node"])
    with pytest.raises(PlanError, match="install the node's python"):
        check_binds(["/root/.hero-node/venv"], ["/root/.hero-node"])
    with pytest.raises(PlanError):
        check_binds(["/"], [])
    check_binds(["/opt/py", "/root/.pyenv"], ["/root/.hero-node"])


@given(st.lists(st.sampled_from(["/a", "/a/b", "/a/b/c", "/b", "/ab", "/b/a"]), min_size=1))
def test_collapse_keeps_only_outermost(paths: list[str]) -> None:
    out = collapse(paths)
    for p in paths:
        assert any(Path(p).is_relative_to(q) for q in out)
    for q in out:
        assert not any(q != r and Path(q).is_relative_to(r) for r in out)


def test_modes_resolve_as_documented() -> None:
    ok = {"strict": "", "namespaces": ""}
    assert resolve_mode("auto", True, ok)[0] == "strict"
    assert resolve_mode("auto", False, ok | {"strict": "cannot"})[0] == "namespaces"
    assert resolve_mode("auto", True, {"strict": "x", "namespaces": "y"})[0] == "refused"
    assert resolve_mode("strict", False, ok)[0] == "refused"
    assert resolve_mode("none", False, {})[0] == "none"


def test_the_seccomp_filter_refuses_what_it_must() -> None:
    for arch, (_audit, nrs) in seccomp.ARCHES.items():
        prog = seccomp.program(arch)
        deny = seccomp.RET_ERRNO | 1
        for name in seccomp.DENIED:
            assert seccomp.run(prog, arch, nrs[name]) == deny, name
        assert seccomp.run(prog, arch, nrs["ioctl"], (1, seccomp.TIOCSTI)) == deny
        assert seccomp.run(prog, arch, nrs["ioctl"], (1, 0x5413)) == seccomp.RET_ALLOW
        assert seccomp.run(prog, arch, nrs["clone"], (0x10000000,)) == deny  # CLONE_NEWUSER
        assert seccomp.run(prog, arch, nrs["clone"], (0x01200011,)) == seccomp.RET_ALLOW
        assert seccomp.run(prog, arch, 0) == seccomp.RET_ALLOW  # read / io_setup
    assert seccomp.run(seccomp.program("x86_64"), "x86_64", 0x40000000) == seccomp.RET_KILL_PROCESS


def test_limits_parse_and_override() -> None:
    table = parse_limits({"memory_mb": 512, "2": {"cpu_s": 5}})
    assert limits_for(table, 1) == Limits(memory_mb=512)
    assert limits_for(table, 2) == Limits(memory_mb=512, cpu_s=5)
    for bad in ({"memory": 1}, {"cpu_s": 0}, {"x": {"cpu_s": 1}}, {"cpu_s": True}):
        with pytest.raises(LimitsError):
            parse_limits(bad)


def test_sandbox_settings_parse_and_override() -> None:
    table = parse_sandbox({"recycle_jobs": 50, "2": {"fresh_process": True, "network": True}})
    assert context_settings(table, 1) == ContextSandbox(False, 50, False)
    assert context_settings(table, 2) == ContextSandbox(True, 50, True)
    everyone = parse_sandbox({"fresh_process": True, "3": {"fresh_process": False}})
    assert context_settings(everyone, 1).fresh_process
    assert not context_settings(everyone, 3).fresh_process
    for bad in ({"fresh_process": 1}, {"2": {"fresh": True}}, {"recycle_jobs": 0}):
        with pytest.raises(SandboxSettingsError):
            parse_sandbox(bad)


def test_limit_reasons_are_tokens() -> None:
    lim = Limits(file_size_mb=1, cpu_s=2)
    assert limit_reason(Ending(None, signal.SIGXCPU), lim, b"", 0) == "cpu_limit"
    assert limit_reason(Ending(None, signal.SIGKILL, 2.5), lim, b"", 0) == "cpu_limit"
    assert limit_reason(Ending(None, signal.SIGXFSZ), lim, b"", 10) == "file_size_limit"
    assert limit_reason(Ending(None, signal.SIGXFSZ), lim, b"", 1 << 20) == "output_limit"
    assert limit_reason(Ending(1), lim, b"...MemoryError\n", 0) == "memory_limit"
    assert limit_reason(Ending(2), lim, b"fork: Resource temporarily unavailable", 0) == (
        "pids_limit"
    )
    assert limit_reason(Ending(0), lim, b"MemoryError", 0) is None
    # a shell reports a child killed by a signal as 128 + its number
    assert limit_reason(Ending(128 + signal.SIGXFSZ), lim, b"", 10) == "file_size_limit"
    assert limit_reason(Ending(128 + signal.SIGXCPU), lim, b"", 0) == "cpu_limit"
    assert limit_reason(Ending(1), lim, b"File too large", 10) == "file_size_limit"
    for token in ("memory_limit", "cpu_limit", "pids_limit", "file_size_limit", "output_limit"):
        assert Reason(token) == token


# -- real sandboxes ---------------------------------------------------------------------------


def _box(
    tmp_path: Path, mode: str, ctx: int = 3, *, fresh: bool = False, **limits: int
) -> tuple[Sandbox, Path]:
    home = tmp_path / "home"
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "node.key").write_text("SECRET-KEY")
    iso = probe(mode, home, "bwrap", home / "work", BASE)
    assert iso.mode == mode, iso.why
    spec = sandbox_spec(iso, home / "work", ctx, BASE, limits, False, 1000, fresh)
    return Sandbox(spec), home


def _run(
    box: Sandbox, tmp_path: Path, script: str, kind: str = "sh", **more_env: str
) -> tuple[dict, str, str]:
    out, err = tmp_path / "out", tmp_path / "err"
    fds = [os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600) for p in (out, err)]
    home = "/job" if box.spec.mode != "none" else box.spec.work_dir  # as job_request does
    env = {"PATH": "/usr/bin:/bin", "HOME": home} | more_env
    request = {"kind": kind, "script": script, "argv": ["/bin/sh", "-s"], "env": env}
    try:
        reply = box.run(request, fds[0], fds[1])
    finally:
        for fd in fds:
            os.close(fd)
    return reply, out.read_text(), err.read_text()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="strict mode needs root here")


@needs_root
@pytest.mark.parametrize("mode", ["strict", "namespaces", "none"])
def test_a_job_cannot_read_the_home_nor_write_outside_its_work_dir(
    tmp_path: Path, mode: str
) -> None:
    box, home = _box(tmp_path, mode)
    outside = tmp_path / "outside"
    script = f"cat {home}/node.key; touch {outside}; echo x > $HOME/mine; cat $HOME/mine"
    try:
        reply, out, _err = _run(box, tmp_path, script)
    finally:
        box.stop()
    sandboxed = mode != "none"
    assert ("SECRET-KEY" in out) is not sandboxed  # the control (none) reads it
    assert outside.exists() is not sandboxed
    assert out.endswith("x\n")
    assert reply["exit_code"] == 0


@needs_root
def test_strict_jobs_run_as_their_context_uid_without_capabilities(tmp_path: Path) -> None:
    box, home = _box(tmp_path, "strict", ctx=7)
    script = "id -u; id -g; grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; ls /proc"
    try:
        _reply, out, _ = _run(box, tmp_path, script)
    finally:
        box.stop()
    lines = out.split("\n")
    assert lines[:2] == [str(BASE + 7), str(BASE + 7)]
    assert "CapEff:\t0000000000000000" in out
    assert "CapBnd:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out
    assert str(os.getpid()) not in lines  # its own pid namespace
    assert (home / "work" / "7").stat().st_uid == BASE + 7
    assert (home / "work" / "7").stat().st_mode & 0o777 == 0o700


@needs_root
@pytest.mark.parametrize("mode", ["strict", "none"])
def test_seccomp_refuses_namespaces_and_ptrace(tmp_path: Path, mode: str) -> None:
    box, _ = _box(tmp_path, mode)
    script = (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print('unshare', libc.unshare(0x10000000))\n"  # CLONE_NEWUSER
        "print('ptrace', libc.ptrace(0, 0, 0, 0))\n"  # PTRACE_TRACEME
    )
    try:
        _reply, out, err = _run(box, tmp_path, script, kind="python")
    finally:
        box.stop()
    refused = mode != "none"
    assert ("unshare -1" in out) is refused, (out, err)
    assert ("ptrace -1" in out) is refused


# prints every "hero-leak-<32 hex>" found in the job's own memory (its process is not
# dumpable, so /proc/self/mem is closed to it: read through ctypes)
MEMORY_SCAN = r"""
import ctypes, os, re
pat = re.compile(rb"hero-leak-[0-9a-f]{32}")
found = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        fields = line.split()
        if fields[1].startswith("r") and not fields[-1].startswith("[v"):
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            found.update(pat.findall(ctypes.string_at(lo, hi - lo)))
print(sorted(f.decode() for f in found), "PASSWORD" in os.environ)
"""


@needs_root
@pytest.mark.parametrize("fresh", [True, False], ids=["fresh_process", "warm"])
def test_a_job_never_finds_an_earlier_jobs_request_in_its_memory(
    tmp_path: Path, fresh: bool
) -> None:
    """With ``fresh_process``, a job's process is forked from the sandbox's worker before its
    request comes and reads it itself: the worker never holds a script or an environment
    another job could find (the next job of the context, perhaps another caller's). In a warm
    process (the default) the next python job of the context finds it: the trade-off the docs
    state, shown here so that the fresh case is known to be able to fail."""
    box, _ = _box(tmp_path, "strict", fresh=fresh)
    token = "hero-leak-" + os.urandom(16).hex()
    first = f"a = '{token}'\n" + "#" * 3000 + f"\nb = '{token}'\n"
    try:
        reply, _, _ = _run(box, tmp_path, first, "python", PASSWORD=token, MORE=token * 10)
        assert reply["exit_code"] == 0
        own = "hero-leak-" + "0" * 32  # the control: what is in the job's own request is found
        reply, out, err = _run(box, tmp_path, MEMORY_SCAN, "python", OWN=own)
    finally:
        box.stop()
    assert reply["exit_code"] == 0, err
    if fresh:
        assert out == f"{[own]} False\n"
    else:
        assert out == f"{sorted([own, token])} False\n"  # the environment was replaced


@needs_root
def test_a_job_whose_setup_fails_ends_alone_and_the_worker_goes_on(tmp_path: Path) -> None:
    """A job's process whose setup fails exits at once (127), without unwinding into the
    worker's loop or running the worker's interpreter teardown in a fork."""
    box, _ = _box(tmp_path, "strict")
    fds = [os.open(tmp_path / n, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600) for n in "oe"]
    try:
        request = {"kind": "python", "script": "print(1)", "env": None}
        failed = box.run(request, fds[0], fds[1])  # env None: the setup raises AttributeError
        reply, out, _ = _run(box, tmp_path, "print('next')", "python")
    finally:
        for fd in fds:
            os.close(fd)
        box.stop()
    assert failed["exit_code"] == 127
    assert (reply["exit_code"], out) == (0, "next\n")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


# a daemon in a session of its own, there before the job ends
# The daemon sleeps for a duration no other test uses: the test looks for it in the host's
# /proc, beside whatever else runs there.
NAP = f"300.{secrets.randbelow(10**6):06d}"
LEAVER = (
    f"setsid sh -c 'echo $$ > /tmp/d; exec sleep {NAP}' & while [ ! -s /tmp/d ]; do :; done;"
    " echo $!"
)


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


@needs_root
def test_what_a_job_leaves_behind_is_killed_and_nothing_else(tmp_path: Path) -> None:
    """A setsid daemon of a strict job dies with the job; under "none" (no pid namespace to
    sweep) a process outside the job survives the job's end."""
    bystander = subprocess.Popen(["sleep", "60"])  # noqa: S607
    try:
        box, _ = _box(tmp_path, "strict")
        try:
            _reply, out, _ = _run(box, tmp_path, LEAVER)
            left = [p for p in Path("/proc").iterdir() if p.name.isdigit()]
            daemons = [p for p in left if _cmdline(p) == f"sleep\0{NAP}\0".encode()]
        finally:
            box.stop()
        assert out.strip()
        assert daemons == []
        none_box, _ = _box(tmp_path / "n", "none")
        try:
            reply, _, _ = _run(none_box, tmp_path, "echo done")
        finally:
            none_box.stop()
        assert reply["exit_code"] == 0
        assert _alive(bystander.pid)
    finally:
        bystander.kill()
        bystander.wait()


# a leftover that holds much memory: killed, it takes a while to release it and end
FAT_LEAVER = (
    'python3 -c \'import time; b = b"x" * (1200 << 20); open("/tmp/up", "w").close();'
    " time.sleep(300)' &\nwhile [ ! -e /tmp/up ]; do sleep 0.01; done; rm /tmp/up; echo $!"
)


@needs_root
@pytest.mark.parametrize("fresh", [True, False], ids=["fresh_process", "warm"])
def test_the_next_job_never_meets_what_the_last_one_left(tmp_path: Path, fresh: bool) -> None:
    """The sweep waits until each process it killed has ended: the answer, and so the next
    job of the sandbox, comes only after (its pid namespace: the next job sees it in /proc)."""
    box, _ = _box(tmp_path, "strict", fresh=fresh)
    look = "cat /proc/$LEFT/stat 2>/dev/null | cut -d' ' -f3; echo end"
    try:
        _reply, left, err = _run(box, tmp_path, FAT_LEAVER)
        assert left.strip().isdigit(), err
        _reply, out, _ = _run(box, tmp_path, look, LEFT=left.strip())
    finally:
        box.stop()
    assert out == "end\n"  # neither alive nor a zombie: its state would come first


LIMIT_CASES = {
    "cpu_limit": ("sh", "while :; do :; done", {"cpu_s": 1}),
    "memory_limit": ("python", "b = bytearray(400 * 1024 * 1024)", {"memory_mb": 200}),
    "pids_limit": ("python", "import os\nfor _ in range(50):\n    os.fork() or os._exit(0)\n"
                   "    import time; time.sleep(0)\n" , {"processes": 5}),
    "file_size_limit": ("sh", "head -c 3000000 /dev/zero > $HOME/big", {"file_size_mb": 1}),
    "output_limit": ("sh", "head -c 3000000 /dev/zero", {"file_size_mb": 1}),
}  # fmt: skip


@needs_root
@pytest.mark.parametrize("reason", sorted(LIMIT_CASES))
def test_each_limit_fires_with_its_reason_and_harms_nothing_else(
    tmp_path: Path, reason: str
) -> None:
    kind, script, limits = LIMIT_CASES[reason]
    box, _ = _box(tmp_path, "strict", **limits)
    try:
        reply, _out, err = _run(box, tmp_path, script, kind=kind)
        sizes = max((tmp_path / n).stat().st_size for n in ("out", "err"))
        ending = Ending(reply["exit_code"], reply["signal"], reply["cpu_s"])
        assert limit_reason(ending, box.spec.limit_values, err.encode(), sizes) == reason
        after, out, _ = _run(box, tmp_path, "echo fine")  # the same sandbox goes on
        assert after["exit_code"] == 0
        assert out == "fine\n"
    finally:
        box.stop()


def test_a_missing_bwrap_refuses_to_run_jobs(tmp_path: Path) -> None:
    iso = probe("auto", tmp_path / "home", "/nonexistent/bwrap", tmp_path / "work", BASE)
    assert iso.mode == "refused"
    assert "bwrap not found" in iso.why
    assert not iso.runs_jobs
    assert probe("none", tmp_path / "home", "/nonexistent/bwrap", tmp_path, BASE).runs_jobs


@needs_root
def test_a_recycled_worker_is_replaced_by_a_spare_started_ahead(tmp_path: Path) -> None:
    # starting a worker takes ~80 ms: the job after a recycling must not wait for it
    box, _ = _box(tmp_path, "strict")
    box.spec = dataclasses.replace(box.spec, recycle_jobs=2)
    spares = []
    try:
        reply, out, _ = _run(box, tmp_path, "echo one")
        assert (reply["exit_code"], out) == (0, "one\n")
        first = box.pid
        box.keep_spare()  # as the runner does once the job is answered
        assert box.spare is not None  # started after the first job of its last two
        spares.append(box.spare.proc)
        assert spares[0].poll() is None
        _run(box, tmp_path, "echo two")
        box.keep_spare()
        assert box.proc is None  # retired after its second job
        assert box.spare is not None
        assert box.spare.proc is spares[0]
        reply, out, _ = _run(box, tmp_path, "echo three")
        assert (reply["exit_code"], out) == (0, "three\n")
        assert box.pid == spares[0].pid != first  # the spare, now serving
        box.keep_spare()
        assert box.spare is not None  # and its own replacement started
        spares.append(box.spare.proc)
    finally:
        box.stop()
    assert [p.poll() is not None for p in spares] == [True, True]  # stop ends spares too
    assert box.spare is None


@given(st.integers(1, 100_000), st.integers(0, 2**32))
def test_a_workers_recycle_point_is_at_most_recycle_jobs_and_an_eighth_less(
    recycle_jobs: int, seed: int
) -> None:
    point = recycle_point(recycle_jobs, random.Random(seed))
    assert recycle_jobs - recycle_jobs // 8 <= point <= recycle_jobs
    if recycle_jobs < 8:
        assert point == recycle_jobs  # 1 stays a fresh worker per job


def test_the_recycle_points_of_a_nodes_slots_are_drawn_apart() -> None:
    # slots take jobs in turn: with one count they all replaced their workers at once
    rng = random.Random(7)
    assert len({recycle_point(1000, rng) for _ in range(8)}) > 1


class _Drawn(random.Random):
    def __init__(self, value: int) -> None:
        super().__init__()
        self.value = value

    def randrange(self, *args: int, **kw: int) -> int:  # type: ignore[override]
        return self.value


@needs_root
def test_a_worker_is_replaced_at_its_own_recycle_point(tmp_path: Path) -> None:
    spec = dataclasses.replace(_box(tmp_path, "strict")[0].spec, recycle_jobs=16)
    box = Sandbox(spec, _Drawn(2))  # this worker runs 16 - 2 jobs
    try:
        for n in range(1, 15):
            reply, out, _ = _run(box, tmp_path, f"echo {n}")
            assert (reply["exit_code"], out) == (0, f"{n}\n")
            assert box.proc is not None  # serving until its last job is answered
            box.keep_spare()  # as the runner does once the job is answered
        assert box.proc is None  # retired after 14 jobs, not 16
        assert box.spare is not None
    finally:
        box.stop()


@needs_root
@pytest.mark.parametrize("mode", ["strict", "namespaces", "none"])
@pytest.mark.parametrize("kind", ["python", "sh"])
def test_a_kill_ends_the_job_in_every_mode(tmp_path: Path, mode: str, kind: str) -> None:
    """A timeout or a stop kills the sandbox: the job ends at once, with every process it
    started. Under "none" the job process leads its own session: killing the worker's process
    group alone left it running to its end."""
    box, _ = _box(tmp_path, mode)
    script = {
        "python": "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(30)",
        "sh": "sleep 30 & echo $!; wait",
    }[kind]
    request = {"kind": kind, "script": script, "argv": ["/bin/sh", "-s"], "env": {}}
    if mode != "none":
        request["env"] = {"PATH": "/usr/bin:/bin", "HOME": "/job"}
    read_end, out = os.pipe()
    err = os.open(tmp_path / "err", os.O_RDWR | os.O_CREAT, 0o600)
    seen: list[int] = []

    def kill_once_running() -> None:
        with open(read_end) as lines:  # the job's first line: it runs
            seen.append(int(lines.readline()))
        box.kill()

    killer = threading.Thread(target=kill_once_running)
    killer.start()
    try:
        with pytest.raises(SandboxLost):
            box.run(request, out, err)
    finally:
        os.close(out)
        os.close(err)
        killer.join()
        box.stop()
    if mode == "none":  # the pid as the host sees it (a namespace's differs)
        assert not _alive(seen[0])


class _KilledAsItAnswers(Sandbox):
    """A sandbox whose kill comes once the job's answer waits in the socket, unread: the
    order a kill's signals allow (the job's processes first, then the worker, which may live
    to answer), held open."""

    armed = False

    def _receive(self) -> dict[str, Any]:
        if self.armed:
            self.armed = False
            assert self.sock is not None
            select.select([self.sock], [], [], 10)  # the answer is there
            self.kill()
        return super()._receive()


@needs_root
@pytest.mark.parametrize("mode", ["strict", "namespaces", "none"])
def test_an_answer_that_races_a_kill_leaves_the_next_job_a_live_worker(
    tmp_path: Path, mode: str
) -> None:
    """A job that ended on its own just before a kill (a timeout at its last moment, a stop)
    keeps its answer: it ran to its end once, and giving it back would run it again. The
    worker is dead behind that answer, and the next job meets a new one: before, its request
    went to the dead worker's socket, and that job was lost (``runner_lost``)."""
    spec = _box(tmp_path, mode)[0].spec
    box = _KilledAsItAnswers(spec)
    try:
        box.start()  # its hello read, not armed
        box.armed = True
        reply, out, _ = _run(box, tmp_path, "echo one")
        assert (reply["exit_code"], out) == (0, "one\n")
        reply, out, _ = _run(box, tmp_path, "echo two")
        assert (reply["exit_code"], out) == (0, "two\n")
        # an answer that a kill's SIGKILL would give is taken for the kill's: the job ends as
        # a kill (a timeout, a stop) does, whichever of the two came first
        box.armed = True
        with pytest.raises(SandboxLost):
            _run(box, tmp_path, "kill -KILL $$")
        reply, out, _ = _run(box, tmp_path, "echo three")
        assert (reply["exit_code"], out) == (0, "three\n")
        box.kill()  # a kill that comes after the answer was read: the next job still runs
        reply, out, _ = _run(box, tmp_path, "echo four")
        assert (reply["exit_code"], out) == (0, "four\n")
    finally:
        box.stop()


# a sandbox in a process of its own that is a child subreaper, as a runner process is;
# argv: mode, a directory, the uid base, recycle_jobs; the test's script follows
_AS_RUNNER = """
import json, os, sys, threading
from pathlib import Path
from node.sandbox.host import Sandbox
from node.sandbox.spawn import SandboxLost
from node.sandbox.probe import probe, sandbox_spec
from node.worker.pyjobs import become_subreaper

assert become_subreaper()
mode, tmp, base, recycle = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
home = tmp / "home"
home.mkdir(mode=0o700)
iso = probe(mode, home, "bwrap", home / "work", base)
box = Sandbox(sandbox_spec(iso, home / "work", 3, base, {}, False, recycle))
env = {"PATH": "/usr/bin:/bin", "HOME": "/job" if mode != "none" else box.spec.work_dir}
"""


def _as_runner(tmp_path: Path, mode: str, recycle: int, script: str, *args: str) -> dict[str, Any]:
    """What ``script`` (after :data:`_AS_RUNNER`) printed as JSON; ``args`` follow its four."""
    argv = [mode, str(tmp_path), str(BASE), str(recycle), *args]
    got = subprocess.run(
        [sys.executable, "-c", _AS_RUNNER + script, *argv],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)  # type: ignore[no-any-return]


_ADOPTER = """
outs = []
def run(script):
    fd = os.open(tmp / "out", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        request = {"kind": "sh", "script": script, "argv": ["/bin/sh", "-s"], "env": env}
        return box.run(request, fd, fd)
    finally:
        os.close(fd)
for _ in range(3):  # the worker is retired after its second job
    outs.append(run("echo ran")["exit_code"])
    box.keep_spare()
threading.Timer(0.2, box.kill).start()
try:
    run("sleep 30")
except SandboxLost:
    outs.append("killed")
box.stop()
kids = [int(c) for t in os.listdir("/proc/self/task")
        for c in open(f"/proc/self/task/{t}/children").read().split()]
states = [open(f"/proc/{c}/stat").read().rsplit(")", 1)[1].split()[0] for c in kids]
print(json.dumps({"outs": outs, "left": states}))
"""


@needs_root
@pytest.mark.parametrize("mode", ["strict", "namespaces", "none"])
def test_a_retired_or_killed_worker_leaves_the_runner_no_zombie(tmp_path: Path, mode: str) -> None:
    """The runner process is a child subreaper: what its sandboxes leave when a worker is
    retired, killed or stopped (bwrap's init of the namespace, a job process) is adopted by
    it and must be reaped, not kept as a zombie per worker for the runner's life (and its CPU
    counted in no process)."""
    report = _as_runner(tmp_path, mode, 2, _ADOPTER)
    assert report["outs"] == [0, 0, 0, "killed"]
    assert report["left"] == []


# the kill of _ADOPTER held open between its signals and its end: the job's thread sees the
# worker die, and ends it and the sandbox, while the killing thread has not returned
_SLOW_KILL = """
import time
import node.sandbox.spawn as spawn
signalled = spawn.kill_group
def kill_group_then_wait(proc):
    signalled(proc)
    time.sleep(0.5)
spawn.kill_group = kill_group_then_wait
"""


@needs_root
def test_a_worker_killed_from_another_thread_leaves_no_zombie_however_slow(tmp_path: Path) -> None:
    """A kill (another thread's: a timeout, a stop) hands what it ends to the reaping before
    its first signal, so the job's thread, which sees the worker die after that signal, reaps
    every process the kill found, however long the killing thread takes to return."""
    report = _as_runner(tmp_path, "strict", 2, _SLOW_KILL + _ADOPTER)
    assert report["outs"] == [0, 0, 0, "killed"]
    assert report["left"] == []


# argv[5]: how the worker ends after its job: retired (``keep_spare``, as a runner does once
# the job is answered) or stopped as a runner that leaves stops it (``stop(graceful=True)``)
_SPENDER = """
spin = "import time\\nwhile time.process_time() < 0.2:\\n    pass"
fd = os.open(tmp / "out", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
reply = box.run({"kind": "python", "script": spin, "argv": [], "env": env}, fd, fd)
os.close(fd)
before = os.times()
if sys.argv[5] == "retired":
    box.keep_spare()
else:
    box.stop(graceful=True)
after = os.times()
box.stop()
counted = after.children_user + after.children_system
counted -= before.children_user + before.children_system
print(json.dumps({"exit_code": reply["exit_code"], "counted": counted, "left": box.proc}))
"""


@needs_root
@pytest.mark.parametrize("mode", ["strict", "none"])
@pytest.mark.parametrize("way", ["retired", "runner leaving"])
def test_an_ended_workers_cpu_is_counted_in_its_runner(tmp_path: Path, mode: str, way: str) -> None:
    """A worker retired after its last job, or stopped by a runner that leaves (drained,
    recycled), exits by itself and is reaped all the way up, so the CPU its jobs used shows
    in the runner's children time (what the bench and any operator's process accounting
    read). Killed, its pid namespace's init would have dropped it uncounted: the kernel lets
    a dying init's children reap themselves."""
    report = _as_runner(tmp_path, mode, 1 if way == "retired" else 1000, _SPENDER, way)
    assert (report["exit_code"], report["left"]) == (0, None)
    assert report["counted"] >= 0.2  # the job's 0.2 s of CPU at least


def test_a_worker_that_cannot_start_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """A worker whose cgroup cannot be made is not started (SandboxLost), and its start
    closes everything it opened for it: a runner that tries again and again must not run out
    of descriptors."""
    (tmp_path / "3").mkdir()  # a context's work dir is named after it
    gone = {"version": "v2", "dirs": {UNIFIED: str(tmp_path / "no-cgroup-here")}, "prefix": "t"}
    spec = SandboxSpec(mode="none", work_dir=str(tmp_path / "3"), cgroups=gone)
    before = sorted(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(SandboxLost, match="cgroup"):
            spawn(spec, None)
    assert sorted(os.listdir("/proc/self/fd")) == before
