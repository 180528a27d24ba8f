"""Our lone round trip beside SAQ's, in the same minutes: the p50 bar without the schedule.

``bench/run.py --peers`` runs SAQ after all of our cases, minutes after case 3, and on a shared
machine two minutes can differ by more than the bar's margin (bench/HISTORY.md#stop-37-runs).
This keeps both up at once:
- ours as case 3 runs it: nodes A and B, the bench's client with a reply inbox, the bench's job;
- SAQ's worker as ``../shared/peers/peer_saq.py`` configures it, on a Valkey of its own without
  persistence, driven by ``bench/saq_rounds.py`` in SAQ's pinned virtualenv.

Each side is warmed, then the two run blocks of sequential round trips in turn, the first of
each round swapped round by round. Each round gives our p50 over SAQ's (nearest rank, as case 3
takes it); the median over the rounds is the figure, beside issue 44's bar (<= 1.1). Needs the
peers' virtualenvs: the first ``bench/run.py --peers`` builds them.

    .venv/bin/python bench/alternate.py                   # 8 rounds of 300
    .venv/bin/python bench/alternate.py --rounds 12 --n 200
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import cases, harness, peers  # noqa: E402
from bench.harness import Row  # noqa: E402
from bus.client.api import open_client  # noqa: E402
from bus.client.inbox import new_inbox_name  # noqa: E402
from node.host.valkey import valkey_server  # noqa: E402

CASE = "3 alternated"
BAR_LIMIT = 1.1  # issue 44: local p50 <= 1.1 x SAQ's
BAR = f"<= {BAR_LIMIT}"
OURS, SAQ = "ours", "saq"
SAQ_DB = 4  # the database peer_saq.py's default URL names


def orders(rounds: int) -> list[tuple[str, str]]:
    """Who runs first in each round: ours in the first, then SAQ's, and so on, so that neither
    side always follows the other."""
    return [(OURS, SAQ) if r % 2 == 0 else (SAQ, OURS) for r in range(rounds)]


def round_rows(rounds: list[tuple[list[float], list[float]]]) -> list[Row]:
    """The rows of ``rounds`` (per round: our round trips' times, SAQ's, in ms): our p50 over
    SAQ's round by round, its median beside the bar, and each side's p50s."""
    ours = [harness.percentile(o, 50) for o, _ in rounds]
    theirs = [harness.percentile(s, 50) for _, s in rounds]
    ratios = [o / s for o, s in zip(ours, theirs, strict=True)]
    n = len(rounds[0][0]) if rounds else 0
    under = sum(r <= BAR_LIMIT for r in ratios)
    return [
        Row(
            CASE,
            f"local p50 / SAQ p50, {len(rounds)} rounds of {n} each side",
            "x",
            ratios,
            BAR,
            note=f"{under} of {len(ratios)} rounds at or under the bar; round by round: "
            + ", ".join(f"{r:.2f}" for r in ratios),
        ),
        Row(CASE, "local p50, ours, round by round", "ms", ours),
        Row(CASE, "round trip p50, SAQ, round by round", "ms", theirs),
    ]


def saq_python() -> Path:
    """SAQ's virtualenv's python, as compare.sh built it; RuntimeError saying how to build it
    if it is not there."""
    python = peers.peer_home() / "venvs" / "saq" / "bin" / "python"
    if not python.exists():
        raise RuntimeError(
            f"no SAQ virtualenv at {python.parent.parent}: run `bench/run.py --peers` once "
            "(it builds the peers' virtualenvs), or name their folder in PEERBENCH"
        )
    return python


class SaqSide:
    """SAQ's worker and the driver of its round trips (bench/saq_rounds.py), on ``url``; both
    stopped by their PIDs in :meth:`close`."""

    def __init__(self, url: str, logs: Path) -> None:
        python = saq_python()
        where = peers.COMPARE.parent  # peer_saq.py, whose settings the worker loads
        env = os.environ | {"PEER_SAQ_URL": url}
        self.logs = (logs / "saq-worker.log", logs / "saq-driver.log")
        with self.logs[0].open("wb") as worker_log, self.logs[1].open("wb") as driver_log:
            self.worker = subprocess.Popen(
                [str(python.parent / "saq"), "peer_saq.settings", "--workers", "1"],
                cwd=where,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=worker_log,
                start_new_session=True,  # its own group: the worker forks, all of it is stopped
            )
            self.driver = subprocess.Popen(
                [str(python), str(ROOT / "bench" / "saq_rounds.py")],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=driver_log,
                text=True,
            )
        if self._line() != "ready":
            raise RuntimeError(f"SAQ's driver did not start{self._why()}")

    def _line(self) -> str:
        assert self.driver.stdout is not None
        line = self.driver.stdout.readline()
        if not line:
            raise RuntimeError(f"SAQ's driver exited{self._why()}")
        return line.strip()

    def _why(self) -> str:
        """The last lines of the worker's and the driver's logs (their dir goes with the run)."""
        tails = []
        for path in self.logs:
            lines = path.read_text(errors="replace").strip().splitlines()[-5:]
            if lines:
                tails.append(f"{path.name}: " + " | ".join(lines))
        return "; " + "; ".join(tails) if tails else ""

    def block(self, n: int) -> list[float]:
        """``n`` sequential round trips; their times in ms (blocking: run it in a thread)."""
        assert self.driver.stdin is not None
        self.driver.stdin.write(f"{n}\n")
        self.driver.stdin.flush()
        return [float(t) for t in json.loads(self._line())]

    def close(self) -> None:
        if self.driver.stdin is not None:
            self.driver.stdin.close()
        for proc, stop in ((self.driver, self.driver.terminate), (self.worker, self._stop_worker)):
            if proc.poll() is None:
                stop()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    def _stop_worker(self) -> None:
        os.killpg(self.worker.pid, signal.SIGTERM)


async def measure(rounds: int, n: int, warm: int) -> list[Row]:
    """Both sides up, warmed with ``warm`` round trips each, then ``rounds`` rounds of ``n``."""
    done: list[tuple[list[float], list[float]]] = []
    async with cases.tool_env(cases.Plan.make(False, 1, None), "hero-alternate-") as env:
        with valkey_server(env.base / "saq-valkey", persist=False) as server:
            saq = SaqSide(f"{server.spec.url}/{SAQ_DB}", env.base)
            try:
                a, _ = await env.get_pair()
                async with open_client(a.redis_url, inbox=new_inbox_name()) as client:

                    async def ours(count: int) -> list[float]:
                        return await cases.roundtrips(client, env.actor, a.node_id, count)

                    await ours(warm)
                    await trio.to_thread.run_sync(saq.block, warm)
                    for number, order in enumerate(orders(rounds), 1):
                        got: dict[str, list[float]] = {}
                        for side in order:
                            if side == OURS:
                                got[side] = await ours(n)
                            else:
                                got[side] = await trio.to_thread.run_sync(saq.block, n)
                        done.append((got[OURS], got[SAQ]))
                        o, s = (harness.percentile(got[k], 50) for k in (OURS, SAQ))
                        print(
                            f"[alternate] round {number}: ours {o:.3f} ms, SAQ {s:.3f} ms,"
                            f" {o / s:.2f} x",
                            file=sys.stderr,
                            flush=True,
                        )
            finally:
                saq.close()
    return round_rows(done)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds, each side once a round")
    parser.add_argument("--n", type=int, default=300, help="round trips per side and round")
    parser.add_argument("--warm", type=int, default=1000, help="round trips each side first")
    args = parser.parse_args()
    if args.rounds < 1 or args.n < 1 or args.warm < 0:
        parser.error("--rounds and --n must be at least 1, --warm at least 0")
    try:
        rows = trio.run(measure, args.rounds, args.n, args.warm)
    except RuntimeError as exc:
        sys.exit(f"bench/alternate.py: {exc}")
    print(harness.render_table(rows))


if __name__ == "__main__":
    main()
