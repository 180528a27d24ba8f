"""A runner slot's spec for tests that drive a runner's loop or job run in this process, on a
real Valkey (no runner process): slot ``v:0`` of context 1, python jobs in this interpreter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.slot.spec import RunnerSpec


def slot_spec(redis_url: str, tmp_path: Path, **changes: Any) -> RunnerSpec:
    """Slot ``v:0``'s spec, its run directory ``tmp_path``; ``changes`` override fields."""
    fields: dict[str, Any] = dict(
        url=redis_url,
        ctx=1,
        script_type="v",
        slot=0,
        command=[],
        group="",
        token_base="n:b:1:v:0",
        lease_ttl_ms=15_000,
        run_dir=str(tmp_path),
        max_output_bytes=1000,
        reply_ttl_s=60,
        node_id="n",
        in_process=True,
        max_jobs=10,
    )
    return RunnerSpec(**(fields | changes))
