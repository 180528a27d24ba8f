"""A context is bounded as a whole (issue 46; docs/security/bounds.md), through real nodes:

* a job writing past its context's disk quota ends ``disk_limit`` while a job of another context
  writes and finishes, and the next job of the context runs (``work_dir = "per_job"``);
* a job of 8 processes touching 512 MiB each under a 1 GiB bound ends ``memory_limit``;
* a fork bomb ends ``pids_limit`` and the next job runs;
* a job of 4 busy processes, each under ``cpu_s`` but together over it, ends ``cpu_limit``
  (its tree's CPU time, read at the runner's watch tick) and the next job runs;
* a file a job left in /tmp is not seen by the next job of the same slot;
* ``status`` (text and --json) and /metrics say which bounds are in force, and each context's
  disk use against its quota.

The cgroup and disk cases need root on a host with cgroups (this machine and CI: cgroup v1).
Each test removes, by its node's name, what a killed runner could leave: cgroup leaves and
loop devices of its images.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from bus.client.api import open_client
from crypto import read_key_file
from node.config import render_config
from node.config.console import ConsoleConfig
from node.sandbox import cgroups, disk, host
from node.sandbox.disk import IMAGES
from node.sandbox.limits import (
    Limits,
    LimitsError,
    limits_for,
    parse_limits,
    raised,
)
from node.sandbox.probe import cgroup_name
from node.sandbox.settings import SandboxSettingsError, context_settings, parse_sandbox
from node.slot.outcomes import Ending, limit_reason
from tests.nodeproc import NodeProcess
from tests.observe.test_dlq import hero_node
from tests.observe.test_metrics import scrape, value
from tests.runners.test_runners import submit
from tests.sandbox.test_sandbox import _box, _run
from tests.scripts import announcing, wait_announced

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the bounds need root here")

# the test's own node and its home, by name: whatever a killed runner left of them goes
LEFT_OVER = "cgroup leaves and loop devices"


def _leaves_of(home: Path) -> list[Path]:
    """The cgroup directories of the node of ``home``, in every hierarchy. Other tests' nodes
    make and remove their own leaves meanwhile: ``os.walk`` skips a directory gone between
    its listing and its walk, where a walk that raised would fail this test over another's
    cleanup."""
    prefix = f"hero-{cgroup_name(home)}-"
    return [
        Path(parent, name)
        for parent, dirs, _files in os.walk("/sys/fs/cgroup")
        for name in dirs
        if name.startswith(prefix)
    ]


def remove_leftovers(home: Path) -> None:
    """The cgroup leaves of the node of ``home`` and the loop devices of its images, by name
    (a node that ended cleanly leaves neither: its leaves are removed as its sandboxes end,
    its mounts go with its mount namespace)."""
    for leaf in reversed(_leaves_of(home)):  # a leaf's children before it
        with contextlib.suppress(FileNotFoundError):
            leaf.rmdir()
    for image in (home / "work" / IMAGES).glob("*.img"):
        out = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            subprocess.run(["losetup", "-d", line.split(":", 1)[0]], check=False)


def leftovers(home: Path) -> list[str]:
    found = [str(p) for p in _leaves_of(home)]
    for image in (home / "work" / IMAGES).glob("*.img"):
        out = subprocess.run(["losetup", "-j", str(image)], capture_output=True, text=True)
        found += out.stdout.splitlines()
    return found


async def status_json(node) -> dict:  # noqa: ANN001 - a RunningNode or a NodeProcess's shape
    code, out, err = await hero_node(node, "status", "--json")
    assert code == 0, err
    return json.loads(out)


async def run_one(node, script_type: str, script: str, **kw: object):  # noqa: ANN001, ANN201
    with trio.fail_after(90):
        [res] = await node.client.wait_results(await submit(node, script_type, script, **kw), 80)
    return res


@pytest.fixture
async def bounded(node_factory, tmp_path: Path) -> AsyncIterator:
    """``await bounded(**limits_of_context_1)``: alice, an in-process node, its runners'
    sandboxes bounded by cgroups (skipped where this host has none)."""
    nodes: list = []

    async def start(runners: dict[str, int] | None = None, console: bool = False, **limits: int):  # noqa: ANN202
        # one slot of each type unless a test says: the tests run one job at a time, and
        # every slot is a process the node's start waits for
        over: dict[str, object] = {"limits": {"1": limits}}
        over["runners"] = runners or {"python": 1, "sh": 1}
        if console:
            over["console"] = ConsoleConfig(listen="127.0.0.1:0")
        alice = await node_factory("alice", **over)
        nodes.append(alice)
        facts = await status_json(alice)
        if not facts["node"].get("limits", "").startswith("cgroup"):
            pytest.skip(f"no cgroups here ({facts['node'].get('limits')})")
        return alice

    yield start
    left = []
    for node in nodes:  # stopped first: its runners' leaves are removed as they end
        node.stop()
        with trio.fail_after(60):
            await node.stopped()
        left += leftovers(node.config.home)
        remove_leftovers(node.config.home)
    assert left == [], LEFT_OVER


def forking(children: int, child: str, *, fail_if_any: bool = False) -> str:
    """A python job that forks ``children`` processes, each running the python line ``child``
    then exiting 0, waits for them all and prints how many failed (``fail_if_any``: and
    exits 1 if any did)."""
    return (
        "import os, time\n"
        "kids = []\n"
        f"for _ in range({children}):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        f"        {child}\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "failed = sum(os.waitpid(k, 0)[1] != 0 for k in kids)\n"
        'print("children failed:", failed)\n'
    ) + ("raise SystemExit(1 if failed else 0)\n" if fail_if_any else "")


# each child touches every page of its block, so every page is charged
EIGHT_TIMES_512 = forking(8, 'block = b"x" * (512 << 20)', fail_if_any=True)


@needs_root
async def test_a_tree_past_its_memory_bound_ends_memory_limit(bounded) -> None:
    """8 x 512 MiB, each process within its own 1 GiB: only the tree's bound stops it."""
    alice = await bounded(memory_mb=1024)
    res = await run_one(alice, "python", EIGHT_TIMES_512)
    assert res.status.value == "error", res
    assert res.reason.startswith("memory_limit"), res.reason
    nxt = await run_one(alice, "python", "print('after')")
    assert nxt.ok, nxt
    assert nxt.stdout == "after\n"


# silent: each process that cannot fork ends without a word, so no stderr says why (with
# rlimits alone the job ends with its exit status only); the cgroup's counter does
FORK_BOMB = """
import os
try:
    while True:
        os.fork()
except OSError:
    os._exit(1)
"""


@needs_root
async def test_a_fork_bomb_ends_pids_limit_and_the_next_job_runs(bounded) -> None:
    alice = await bounded(processes=64, cpu_s=20)
    res = await run_one(alice, "python", FORK_BOMB, timeout_s=60)
    assert res.status.value == "error", res
    assert res.reason.startswith("pids_limit"), res.reason
    nxt = await run_one(alice, "sh", "echo next")
    assert nxt.ok, nxt
    assert nxt.stdout == "next\n"


# each child spins until its own CPU time (not the wall clock) reaches 1.8 s: under its
# RLIMIT_CPU of 2 s, so only the tree's bound (7.2 s of CPU against 2) can stop the job
FOUR_BUSY = forking(4, "while time.process_time() < 1.8: pass")


@needs_root
async def test_a_tree_past_its_cpu_time_ends_cpu_limit_and_the_next_job_runs(bounded) -> None:
    alice = await bounded(cpu_s=2)
    facts = await status_json(alice)
    if facts["node"]["cpu_time"] != "job tree":
        pytest.skip("no cgroup counts a tree's CPU time here")
    res = await run_one(alice, "python", FOUR_BUSY, timeout_s=60)
    assert res.status.value == "error", res
    # the watch tick's reason (it ended the job while it ran), not the job's own end
    assert res.reason.startswith("cpu_limit: the job's processes used"), res.reason
    assert "(cpu_s 2)" in res.reason, res.reason
    nxt = await run_one(alice, "sh", "echo next")
    assert nxt.ok, nxt
    assert nxt.stdout == "next\n"


@needs_root
async def test_a_file_left_in_tmp_is_not_seen_by_the_next_job_of_the_slot(bounded) -> None:
    """One python slot: both jobs run in the same warm sandbox (the same job process, the
    same /tmp tmpfs); the second finds nothing the first left there."""
    alice = await bounded(runners={"python": 1, "sh": 1})
    first = await run_one(
        alice,
        "python",
        "import os\nos.makedirs('/tmp/d/e')\nopen('/tmp/d/e/left', 'w').write('x' * 4096)\n"
        "open('/tmp/left', 'w').write('secret')\nos.chmod('/tmp/d', 0)\nprint(os.getpid())",
    )
    assert first.ok, first
    second = await run_one(alice, "python", "import os\nprint(os.getpid(), os.listdir('/tmp'))")
    assert second.ok, second
    pid, listing = second.stdout.split(" ", 1)
    assert pid == first.stdout.strip(), "not the same sandbox: the test shows nothing"
    # only what the first job left is looked for: the sandbox's own binds may show under /tmp
    # (the node's code, where a checkout lives there)
    left = {"left", "d"} & set(ast.literal_eval(listing.strip()))
    assert not left, listing


@needs_root
async def test_status_and_metrics_say_which_bounds_hold(bounded) -> None:
    alice = await bounded(disk_mb=64, console=True)
    # status reads the home's config.toml: the in-process node's settings written there
    alice.config.config_path.write_text(render_config(alice.config), encoding="utf-8")
    facts = await status_json(alice)
    assert facts["node"]["limits"] in ("cgroup v1", "cgroup v2")
    assert facts["node"]["cpu_time"] in ("job tree", "process")
    # an in-process node has no mount namespace of its own: no quota in force, and it says so
    assert facts["disks"]["1"] == {
        "quota_mb": 64,
        "used_bytes": None,
        "size_bytes": None,
        "enforced": False,
    }
    code, out, _ = await hero_node(alice, "status")
    assert f"limits by {facts['node']['limits']}, cpu_s per {facts['node']['cpu_time']}" in out
    assert "disk: no quota in force (disk_mb 64)" in out
    samples, _ = await scrape(alice)
    assert value(samples, "hero_context_disk_bytes", ctx="1", kind="quota") == 64 * 2**20
    labels = {"mode": facts["node"]["isolation"], "limits": facts["node"]["limits"]}
    assert value(samples, "hero_isolation_mode", cpu_time=facts["node"]["cpu_time"], **labels)


# -- the disk quota, through a node process (its own mount namespace) --------------------------


class DiskNode(NodeProcess):
    """A `hero-node run` with contexts 1 (a quota of 8 MiB, its work dir emptied after each
    job) and 2 (32 MiB)."""

    def __init__(self, home: Path) -> None:
        super().__init__(home, "disky", runners={"sh": 1})
        sandbox = {"1": {"network": True, "work_dir": "per_job"}}
        self.config = replace(self.config, limits={"1": {"disk_mb": 8}, "2": {"disk_mb": 32}})
        self.config = replace(self.config, sandbox=sandbox)
        self.config.config_path.write_text(render_config(self.config), encoding="utf-8")


@pytest.fixture
async def disk_node(tmp_path: Path) -> AsyncIterator[DiskNode]:
    node = DiskNode(tmp_path / "disky")
    try:
        await node.start()
        yield node
    finally:
        await node.close()
        remove_leftovers(node.home)


async def _job(client, node: DiskNode, ctx: int, script: str):  # noqa: ANN001, ANN202
    actor = read_key_file(node.config.actor_key_path)
    msg = await client.submit_job(
        actor,
        node.config.actor_id,
        to=node.node_id,
        context_id=ctx,
        script_type="sh",
        script=script,
    )
    with trio.fail_after(90):
        [res] = await client.wait_results(msg, timeout_s=80)
    return res


@needs_root
@pytest.mark.skipif(bool(disk.tools()), reason=f"no disk quota here: {disk.tools()}")
async def test_a_job_past_its_quota_ends_disk_limit_and_nothing_else_sees_it(disk_node) -> None:
    node = disk_node
    async with open_client(node.redis_url) as client:
        await client.register_context(2, admins=[node.config.actor_id])
        full = await _job(client, node, 1, "head -c 20000000 /dev/zero > big")
        other = await _job(client, node, 2, "head -c 16000000 /dev/zero > big && ls -s big")
        nxt = await _job(client, node, 1, "head -c 4000000 /dev/zero > small && echo wrote")
    assert full.status.value == "error", full
    assert full.reason.startswith("disk_limit"), full.reason
    assert "No space left on device" in full.result.get("stderr", "")
    assert other.ok, other  # context 2's own quota: 16 MB of its 32 MiB
    assert nxt.ok, nxt  # per_job: the full dir was emptied after the failed job
    assert nxt.stdout == "wrote\n"
    code, out, err = await hero_node(node, "status", "--json")
    assert code == 0, err
    disks = json.loads(out)["disks"]
    assert disks["1"]["enforced"], disks
    assert disks["1"]["quota_mb"] == 8
    assert disks["2"]["enforced"], disks
    assert disks["2"]["used_bytes"] >= 16_000_000
    # the node's home never held the bytes: the images are sparse, and their blocks are
    # the jobs' own writes, inside them
    assert not (node.home / "work" / "1" / "big").exists()  # not mounted out here
    await node.close()
    assert leftovers(node.home) == [], LEFT_OVER


# -- the pieces, without root ------------------------------------------------------------------


def test_limits_take_disk_and_cpu_share_and_say_what_a_context_raises() -> None:
    table = parse_limits({"disk_mb": 512, "2": {"disk_mb": 4096}, "3": {"disk_mb": 0}})
    assert limits_for(table, 1) == Limits(disk_mb=512)
    assert limits_for(table, 3).disk_mb == 0  # 0: no quota, allowed for disk_mb alone
    with pytest.raises(LimitsError):
        parse_limits({"memory_mb": 0})
    assert raised(table) == [
        "context 2: disk_mb 4096 (node: 512)",
        "context 3: disk_mb 0 (node: 512)",
    ]
    assert raised(parse_limits({"2": {"disk_mb": 16}})) == []  # lowered: nothing to say
    assert context_settings(parse_sandbox({"3": {"work_dir": "per_job"}}), 3).work_dir == "per_job"
    with pytest.raises(SandboxSettingsError):
        parse_sandbox({"work_dir": "sometimes"})


def test_a_bound_the_runner_saw_names_the_reason_of_a_failed_job() -> None:
    lim = Limits()
    assert limit_reason(Ending(1, bound="memory_limit"), lim, b"", 0) == "memory_limit"
    assert limit_reason(Ending(None, 9, bound="pids_limit"), lim, b"", 0) == "pids_limit"
    assert limit_reason(Ending(0, bound="memory_limit"), lim, b"", 0) is None  # it coped
    # its tree used more CPU than cpu_s (since the last watch tick): past it however it ended
    assert limit_reason(Ending(0, bound="cpu_limit"), lim, b"", 0) == "cpu_limit"
    assert limit_reason(Ending(1), lim, b"No space left on device", 0) == "disk_limit"
    assert limit_reason(Ending(1), lim, b"x: Disk quota exceeded", 0) == "disk_limit"


def _hierarchy(tmp: Path, name: str) -> Path:
    d = tmp / name / "own"
    d.mkdir(parents=True)
    return d


def test_cgroup_v1_is_found_where_the_three_hierarchies_are_writable(tmp_path: Path) -> None:
    lines, cg = [], []
    for i, name in enumerate(("memory", "pids", "cpu,cpuacct", "freezer"), start=30):
        point = tmp_path / name
        _hierarchy(tmp_path, name)
        lines.append(f"{i} 1 0:{i} / {point} rw - cgroup cgroup rw,{name}")
        cg.append(f"{i}:{name}:/own")
    (tmp_path / "mountinfo").write_text("\n".join(lines) + "\n")
    (tmp_path / "cgroup").write_text("\n".join(cg) + "\n")
    found = cgroups.find("n1", str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    assert found.mode == "cgroup v1"
    assert found.dirs == {
        "memory": str(tmp_path / "memory" / "own"),
        "pids": str(tmp_path / "pids" / "own"),
        "cpu": str(tmp_path / "cpu,cpuacct" / "own"),
    }
    assert found.prefix == "hero-n1-"
    assert found.cpu_time == "job tree"  # cpuacct with cpu: the cpu leaf counts the tree's CPU
    # cpuacct a hierarchy of its own (this machine's): a leaf there too
    lines[2] = lines[2].replace("cpu,cpuacct", "cpu")  # its mount point and its options
    _hierarchy(tmp_path, "cpu")
    _hierarchy(tmp_path, "cpuacct")
    lines.append(f"50 1 0:50 / {tmp_path / 'cpuacct'} rw - cgroup cgroup rw,cpuacct")
    (tmp_path / "mountinfo").write_text("\n".join(lines) + "\n")
    (tmp_path / "cgroup").write_text("\n".join([*cg, "50:cpuacct:/own", "32:cpu:/own"]) + "\n")
    apart = cgroups.find("n1", str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    assert apart.dirs["cpu"] == str(tmp_path / "cpu" / "own")
    assert apart.dirs["cpuacct"] == str(tmp_path / "cpuacct" / "own")
    assert apart.cpu_time == "job tree"
    # no cpuacct at all: cpu_s bounds each process only, and status says so
    (tmp_path / "mountinfo").write_text("\n".join(lines[:-1]) + "\n")
    alone = cgroups.find("n1", str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    assert (alone.mode, alone.cpu_time) == ("cgroup v1", "process")
    # without a pids hierarchy: rlimits
    (tmp_path / "mountinfo").write_text("\n".join(x for x in lines if "pids" not in x) + "\n")
    none = cgroups.find("n1", str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    assert none.mode == "rlimits"


def test_cgroup_v2_needs_a_delegated_subtree_with_the_controllers(tmp_path: Path) -> None:
    own = _hierarchy(tmp_path, "unified")
    (tmp_path / "mountinfo").write_text(
        f"40 1 0:40 / {tmp_path / 'unified'} rw - cgroup2 cgroup2 rw\n"
    )
    (tmp_path / "cgroup").write_text("0::/own\n")
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    # a process that is not the node's (a terminal's shell, here pytest's parent) is there:
    # not the node's to move, so no v2
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n{os.getppid()}\n")
    none = cgroups.find("n2", str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    assert none.mode == "rlimits"
    assert (own / "cgroup.subtree_control").read_text() == ""
    (own / "cgroup.procs").write_text(f"{os.getpid()}\n")  # the node's alone: moved, enabled
    found = cgroups.find("n2", str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))
    assert found.mode == "cgroup v2"
    assert found.dirs == {cgroups.UNIFIED: str(own / "hero-n2")}
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"
    assert (own / "hero-node" / "cgroup.procs").read_text() == str(os.getpid())
    (own / "cgroup.controllers").write_text("cpu io\n")  # no memory, no pids delegated
    assert cgroups.find("n3", str(tmp_path / "cgroup"), str(tmp_path / "mountinfo")).version == ""


def test_the_worker_enters_its_cgroups_before_the_sandbox_starts(tmp_path: Path) -> None:
    files = [tmp_path / "a", tmp_path / "b"]
    argv = cgroups.enter_argv([str(f) for f in files], ["/bin/sh", "-c", "echo $$"])
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    pid = done.stdout.strip()
    assert [f.read_text().strip() for f in files] == [pid, pid]  # exec: the same process
    with pytest.raises(ValueError, match="cgroup.procs"):
        cgroups.enter_argv(["relative"], ["true"])


TWO_BUSY = """
import os, time
kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        while time.process_time() < 0.7:
            pass
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
print("done")
"""


@needs_root
def test_a_tree_that_crossed_its_cpu_time_between_ticks_ends_cpu_limit(tmp_path: Path) -> None:
    """No watch tick here (a bare sandbox): the leaf's counter read as the job ends is what
    says its tree (2 x 0.7 s) went past cpu_s = 1, though it exited 0."""
    box, _ = _box(tmp_path, "strict", cpu_s=1)
    if not box.spec.cgroups:
        pytest.skip("no cgroups here")
    try:
        assert box.over_cpu() == ""  # no job running
        reply, out, _err = _run(box, tmp_path, TWO_BUSY, kind="python")
        assert out == "done\n"
        assert (reply["exit_code"], reply.get("bound")) == (0, "cpu_limit"), reply
        reply, out, _err = _run(box, tmp_path, "print('light')", kind="python")
        assert out == "light\n"
        assert "bound" not in reply, reply  # the count starts again with each job
    finally:
        box.stop()


def test_a_leaf_reads_its_trees_cpu_time_on_either_version(tmp_path: Path) -> None:
    v1 = cgroups.Leaf(
        "v1", {"cpu": str(tmp_path / "cpu"), "cpuacct": str(tmp_path / "acct")}, "p-", 1
    )
    for d in v1.dirs.values():
        d.mkdir(parents=True)
    (v1.dirs["cpuacct"] / "cpuacct.usage").write_text("2500000000\n")
    v1.open_counted()
    assert host.tree_cpu_ns(v1.counted) == 2_500_000_000
    v2 = cgroups.Leaf("v2", {cgroups.UNIFIED: str(tmp_path / "u")}, "p-", 1)
    v2.dirs[cgroups.UNIFIED].mkdir(parents=True)
    (v2.dirs[cgroups.UNIFIED] / "cpu.stat").write_text("usage_usec 1500\nuser_usec 1000\n")
    v2.open_counted()
    assert host.tree_cpu_ns(v2.counted) == 1_500_000
    none = cgroups.Leaf("v1", {"cpu": str(tmp_path / "bare")}, "p-", 1)
    none.dirs["cpu"].mkdir(parents=True)  # a cpu hierarchy without cpuacct: not counted
    none.open_counted()
    assert host.tree_cpu_ns(none.counted) is None
    for leaf in (v1, v2, none):
        leaf.remove()


@needs_root
def test_a_process_a_python_job_forked_never_answers_for_the_job(tmp_path: Path) -> None:
    """A warm job process runs a python job itself: a child the job forked that leaves the
    script (an exception, SystemExit) must end there, not go on as the job process and answer
    the runner first (a fork bomb's children did: its job ended ``runner_lost``)."""
    box, _ = _box(tmp_path, "strict")
    script = "import os\nif os.fork() == 0:\n    raise SystemExit(0)\nos.wait()\nprint('parent')"
    try:
        reply, out, _err = _run(box, tmp_path, script, kind="python")
        assert reply["exit_code"] == 0, reply
        assert out == "parent\n"
        reply, out, _err = _run(box, tmp_path, "print('next')", kind="python")
        assert out == "next\n"
    finally:
        box.stop()


def _runner_of(pid: int) -> int:
    """The runner process (``node.worker``) above the job process ``pid``; 0 if none."""
    while pid > 1:
        try:
            if b"node.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return 0
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return 0


@needs_root
async def test_a_runner_killed_under_its_job_leaves_no_cgroup_leaf(bounded) -> None:
    """A runner removes its worker's leaf as the worker ends; one killed with SIGKILL cannot.
    The node removes it when it stops (and at its next start): the fixture's check that no
    leaf is left after the node stops fails without that sweep."""
    alice = await bounded()
    body = "import time\ntime.sleep(30)\n"
    script = announcing(alice.info.redis_url, "pid:leaf", body)
    msg = await submit(alice, "python", script, retries=0)
    runner = _runner_of(await wait_announced(alice.store, "pid:leaf"))
    assert runner, "no runner process above the job"
    assert leftovers(alice.config.home), "the running job's worker has no cgroup leaf"
    os.kill(runner, signal.SIGKILL)
    with trio.fail_after(60):
        [result] = await alice.client.wait_results(msg, timeout_s=60)
    assert result.reason.startswith("runner_lost"), result.reason
