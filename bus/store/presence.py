"""Who runs jobs in a context: the runners with a presence key, each with the jobs it is busy
with (the jobs in its in-flight list). What ``status``, the metrics and the console show; the
presence keys are written by the node's slots (node/runners/presence.py) and by external
runners (docs/use/runners.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from bus.core import keys
from bus.core.models import decode_hash
from bus.store import records
from bus.store.connection import Store


@dataclass(frozen=True)
class LiveRunner:
    runner_id: str
    script_type: str
    local: bool
    address: str
    jobs: list[str]  # job keys it is busy with (empty: idle)
    presence: dict[str, Any]

    @property
    def busy(self) -> bool:
        return bool(self.jobs)


async def live_runners(store: Store, ctx: int) -> list[LiveRunner]:
    """The runners of context ``ctx`` with a presence key (sorted by id), and their jobs.

    Raises StoreError if Redis fails."""
    prefix = keys.presence_runner("")
    names = sorted(await records.presence_names(store, ctx))
    out = []
    for name in names:
        rid = name[len(prefix) :]
        raw = await records.presence(store, ctx, name)
        if raw is None:  # expired meanwhile
            continue
        try:
            presence = json.loads(raw)
        except ValueError:
            presence = {}
        hash_ = decode_hash(await records.read_runner(store, ctx, rid))
        inflight = str(presence.get("inflight") or keys.runner_inflight(rid))
        jobs = await records.entries(store, ctx, inflight)
        out.append(
            LiveRunner(
                runner_id=rid,
                script_type=hash_.get("script_type") or str(presence.get("script_type", "")),
                local=hash_.get("local", "true") == "true",
                address=hash_.get("address", ""),
                jobs=jobs,
                presence=presence,
            )
        )
    return out
