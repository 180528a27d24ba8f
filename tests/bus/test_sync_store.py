"""The runner processes' blocking connection (bus/store/sync.py) translates what Valkey fails
with where it enters: a refused connection and an error reply are SyncStoreErrors (a
StoreError), the reply's text kept; no redis-py class reaches the runner's code."""

from __future__ import annotations

import pytest

from bus.errors import StoreError
from bus.store.atomic.runs_sync import SyncRuns
from bus.store.sync import SyncStore, SyncStoreError, connect
from node.host.valkey import free_port


def test_a_server_that_is_not_there_is_a_store_error() -> None:
    store = SyncStore(connect(f"redis://127.0.0.1:{free_port()}", 1))
    with pytest.raises(SyncStoreError) as failed:
        store.command("LLEN", "q")
    assert isinstance(failed.value, StoreError)
    assert failed.value.reply is None  # no answer: its outcome unknown
    assert not store.leave_if_stale(failed.value)


def test_an_error_reply_is_a_store_error_with_its_text(sync_runs: SyncRuns) -> None:
    sync_runs.store.command("HSET", "job:1:1", "status", "started")
    with pytest.raises(SyncStoreError) as refused:
        sync_runs.held("job:1:1")  # LLEN of a hash
    assert (refused.value.reply or "").startswith("WRONGTYPE")
    with pytest.raises(SyncStoreError) as in_a_transaction:
        sync_runs.give_back("job:1:1", "job:1:2", "queue:x")  # LREM of a hash
    assert (in_a_transaction.value.reply or "").startswith("WRONGTYPE")
    assert sync_runs.store.command("HGET", "job:1:1", "status") == "started"  # still usable
