"""What a link's durable ack costs at the store, without a node: the delivery of a ``msgs``
batch then its wait, on a replicated set started here (a primary, two replicas with
``appendfsync always``, three Sentinels: node/host/replicated.py), three ways alternated round
by round so that a noisy machine hurts all alike:

- ``nowait``: the delivery scripts alone (what the ack would cost with ``waitaof=0,0``);
- ``barrier``: the delivery, then the generic barrier (``INCR durable`` on another connection,
  then ``WAITAOF`` there), as link acks were confirmed before;
- ``own``: the delivery scripts and one ``WAITAOF`` on their own connection (now).

Prints, per way and round, the p50 and p90 of a batch in ms, and the ``INCR`` and ``WAITAOF``
calls per batch (the primary's ``INFO commandstats``; more than one ``WAITAOF`` per batch means a
first 10 ms wait ran out and a second one asked again)::

    .venv/bin/python bench/link_ack.py --rounds 4 --batches 50 --size 10
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.commands import call_counts  # noqa: E402
from bench.harness import percentile  # noqa: E402
from bus.store.atomic import routing  # noqa: E402
from bus.store.connection import Store, open_store  # noqa: E402
from bus.store.durable import NotDurable  # noqa: E402
from node.host.acl import NODE, ensure_secrets  # noqa: E402
from node.host.replicated import SET_ROLES, ReplicatedSet  # noqa: E402

CTX = 1
WAYS = ("nowait", "barrier", "own")


async def _calls(store: Store) -> Counter[str]:
    return call_counts(await store.read(0, lambda r: r.info("commandstats")))


async def _batch(store: Store, way: str, tag: str, size: int) -> None:
    batch = [
        (f"message:7:{tag}-{n}", {"id": f"{tag}-{n}", "caller_id": "7", "context_id": str(CTX)})
        for n in range(size)
    ]
    epoch = store.epoch
    if way == "own":
        await routing.deliver(store, CTX, batch, durable_since=epoch)
        return
    await routing.deliver(store, CTX, batch)
    if way == "barrier":
        await store.durable(epoch)


async def _ready(store: Store) -> None:
    with trio.fail_after(60):
        while True:  # a fresh set: until every replica has synced and rewritten its AOF
            try:
                return await store.durable()
            except NotDurable:
                await trio.sleep(0.1)


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="link-ack-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        servers = ReplicatedSet(Path(tmp) / "store", ensure_secrets(home, SET_ROLES))
        servers.start()
        try:
            async with open_store(servers.url(NODE, waitaof="1,1")) as store:
                await _ready(store)
                for way in WAYS:  # warm: connections made, scripts loaded
                    await _batch(store, way, f"warm-{way}", args.size)
                print("round  way      p50 ms  p90 ms  incr/batch  waitaof/batch")
                for r in range(args.rounds):
                    order = WAYS[r % 3 :] + WAYS[: r % 3]
                    for way in order:
                        before = await _calls(store)
                        took = []
                        for b in range(args.batches):
                            began = time.perf_counter()
                            await _batch(store, way, f"{r}-{way}-{b}", args.size)
                            took.append((time.perf_counter() - began) * 1000)
                        after = await _calls(store)
                        per = {
                            c: (after.get(c, 0) - before.get(c, 0)) / args.batches
                            for c in ("incr", "waitaof")
                        }
                        print(
                            f"{r:5}  {way:7}  {percentile(took, 50):6.2f}  "
                            f"{percentile(took, 90):6.2f}  {per['incr']:10.2f}  "
                            f"{per['waitaof']:13.2f}"
                        )
        finally:
            servers.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batches", type=int, default=50, help="sequential batches per way")
    parser.add_argument("--size", type=int, default=10, help="messages per batch")
    trio.run(main_async, parser.parse_args())


if __name__ == "__main__":
    main()
