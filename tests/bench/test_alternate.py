"""``bench/alternate.py`` compares our p50 with SAQ's round by round. What it must get right:
each round's ratio is of that round's two p50s (nearest rank, as case 3 takes them), the
figure is their median judged against the bar, neither side always runs first, a machine
without SAQ's virtualenv is told how to build it, and SAQ's side never waits for ever."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from bench.alternate import BAR, OURS, ROOT, SAQ, orders, round_rows, saq_python
from node.host.valkey import valkey_server


def test_each_round_runs_both_sides_and_the_first_alternates() -> None:
    got = orders(4)
    assert got == [(OURS, SAQ), (SAQ, OURS), (OURS, SAQ), (SAQ, OURS)]


def test_the_ratio_is_each_round_s_p50s_and_its_median_meets_the_bar_or_not() -> None:
    missed = round_rows(
        [
            ([2.4, 2.6, 9.0], [2.0, 2.0, 2.0]),  # 2.6 / 2.0 = 1.3
            ([1.0, 2.4, 2.4], [2.0, 2.0, 9.0]),  # 2.4 / 2.0 = 1.2
            ([2.1, 2.1, 0.1], [2.0, 2.0, 2.0]),  # 2.1 / 2.0 = 1.05
        ]
    )
    ratio, ours, theirs = missed
    assert ratio.samples == pytest.approx([1.3, 1.2, 1.05])
    assert ratio.target == BAR
    assert ratio.median == pytest.approx(1.2)
    assert ratio.verdict == "MISS"
    assert ratio.note.startswith("1 of 3 rounds at or under the bar")
    assert "3 rounds of 3 each side" in ratio.metric
    assert ours.samples == pytest.approx([2.6, 2.4, 2.1])
    assert theirs.samples == pytest.approx([2.0, 2.0, 2.0])

    met = round_rows([([2.2, 2.2, 2.2], [2.0, 2.0, 2.0]), ([2.0, 2.0, 2.0], [2.0, 2.0, 2.0])])
    assert met[0].median == pytest.approx(1.05)
    assert met[0].verdict == "ok"


def test_without_saq_s_virtualenv_it_says_how_to_build_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PEERBENCH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"bench/run.py --peers"):
        saq_python()
    python = tmp_path / "venvs" / "saq" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    assert saq_python() == python


def test_saq_s_driver_says_why_when_no_worker_comes(tmp_path: Path) -> None:
    """Without a worker the driver would wait for its first answer for ever; it exits, and
    says why, which alternate.py then shows (a real Valkey, SAQ from its own virtualenv)."""
    try:
        python = saq_python()
    except RuntimeError:
        pytest.skip("no SAQ virtualenv here (bench/run.py --peers builds it)")
    with valkey_server(tmp_path / "valkey", persist=False) as server:
        done = subprocess.run(
            [str(python), str(ROOT / "bench" / "saq_rounds.py")],
            env=os.environ | {"PEER_SAQ_URL": f"{server.spec.url}/4", "SAQ_ROUNDS_WAIT_S": "0.5"},
            input="1\n",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1
    assert "ready" not in done.stdout
    assert "no SAQ worker registered" in done.stderr
