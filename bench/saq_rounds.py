"""SAQ's side of ``bench/alternate.py``: sequential round trips on request, run in SAQ's own
virtualenv (the peers' pinned one), never imported by the bench.

It waits for a job as ``../shared/peers/peer_saq.py``'s default configuration does
(``Job.refresh(until_complete=1 s)``, checked again after each time-out, because SAQ 0.26.4
can miss a completion notification), on the queue of the worker that ``peer_saq.settings``
configures. Each line it reads on stdin is a count of round trips; it answers with one line,
the JSON list of their times in ms. It prints ``ready`` once the worker has registered, and
exits with why instead of waiting for ever: no worker registered within ``SAQ_ROUNDS_WAIT_S``
(10 s), or a round trip not answered within :data:`ROUND_TRIP_S`.

    PEER_SAQ_URL=redis://127.0.0.1:PORT/4 <saq venv>/bin/python bench/saq_rounds.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from saq import Queue
from saq.job import TERMINAL_STATUSES, Status

WAIT_CHUNK_S = 1.0
ROUND_TRIP_S = 60.0  # a no-op job unanswered this long: the worker is gone


async def serve(url: str, wait_s: float) -> None:
    queue = Queue.from_url(url)
    await queue.connect()
    # the worker sweeps its active list once it starts: wait for it to register first
    deadline = time.monotonic() + wait_s
    while not [key async for key in queue.redis.scan_iter(match="saq:*worker_info*")]:
        if time.monotonic() > deadline:
            sys.exit(f"no SAQ worker registered on {url} within {wait_s:g} s")
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)

    async def round_trip(x: int) -> None:
        job = await queue.enqueue("add_one", x=x)
        deadline = time.monotonic() + ROUND_TRIP_S
        while job.status not in TERMINAL_STATUSES:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{job.key}: no answer within {ROUND_TRIP_S:g} s")
            try:
                await job.refresh(until_complete=WAIT_CHUNK_S)
            except TimeoutError:  # asyncio.TimeoutError is this since Python 3.11
                await job.refresh()
        if job.status != Status.COMPLETE or job.result != x + 1:
            raise RuntimeError(f"{job.key}: {job.status} {job.error}")

    print("ready", flush=True)
    x = 0
    for line in sys.stdin:
        times = []
        for _ in range(int(line)):
            t0 = time.perf_counter()
            await round_trip(x)
            times.append((time.perf_counter() - t0) * 1000)
            x += 1
        print(json.dumps(times), flush=True)
    await queue.disconnect()


if __name__ == "__main__":
    asyncio.run(serve(os.environ["PEER_SAQ_URL"], float(os.environ.get("SAQ_ROUNDS_WAIT_S", 10))))
