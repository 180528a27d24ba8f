"""The module tracer (tests/walk/modulewalk.py) in a real interpreter: installed by
sitecustomize.py only when its variable is set, it records the project modules a process calls
in their order, and takes a task's
modules between two readings of the clock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.walk import modulewalk

ROOT = Path(__file__).resolve().parents[2]
SITE = str(Path(modulewalk.__file__).parent)

PROGRAM = """
import sys, time, trio
from bus.core import ids
from crypto import signing

async def main():
    signing.canonical_json({"a": 1})
    await trio.sleep(0.01)
    print(time.monotonic_ns(), sys.getprofile() is not None, flush=True)
    ids.now_ms()
    await trio.sleep(0.01)

trio.run(main)
"""


def _run(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_a_traced_process_writes_its_modules_in_order(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=SITE, **{modulewalk.ENV: str(tmp_path)})
    said = _run(env).split()
    assert said[1] == "True"
    mark = int(said[0])
    [trace] = modulewalk.read_traces(tmp_path).values()
    assert trace.ppid == os.getpid()
    before = [m for ns, _, m in trace.lines if ns < mark and m != "~"]
    assert before[-1] == "crypto/signing.py"  # the last call before the mark
    after = [m for ns, _, m in trace.lines if ns > mark and m != "~"]
    assert after[:1] == ["bus/core/ids.py"]  # the first call after the mark, nothing resumed
    [chain] = trace.chains(mark, mark + 10**10, (0, 0))
    assert chain[0] == "bus/core/ids.py"


def test_without_the_variable_nothing_is_installed() -> None:
    env = {k: v for k, v in os.environ.items() if k != modulewalk.ENV}
    assert _run(dict(env, PYTHONPATH=SITE)).split()[1] == "False"
