"""The newest objects of one kind in a context DB (jobs, flows, messages), found without an
index.

Nothing on the job path keeps a "recent jobs" list, and the console must not add work there.
So the console discovers keys with SCAN, a bounded number of steps per refresh (a huge DB is
walked over several refreshes, never in one long burst), reads each new key's ``created_at``
once, and keeps the newest ``keep`` of them. The keys seen are remembered (one string each),
so a full walk costs SCAN steps and no reads of old hashes.
"""

from __future__ import annotations

import bisect
from typing import Final

from bus.store import records
from bus.store.connection import Store

SCAN_COUNT: Final = 500  # keys the server looks at per SCAN step
SCAN_STEPS: Final = 20  # SCAN steps per refresh: at most 10 000 keys looked at per second


class Recent:
    """The newest ``keep`` keys matching ``pattern`` in DB ``db``, by their ``created_at``."""

    def __init__(self, db: int, pattern: str, keep: int) -> None:
        self.db = db
        self.pattern = pattern
        self.keep = keep
        self._cursor = 0
        self._seen: set[str] = set()
        self._newest: list[tuple[int, str]] = []  # ascending (created_at, key)

    @property
    def newest(self) -> list[str]:
        """The newest keys known, newest first."""
        return [key for _, key in reversed(self._newest)]

    async def refresh(self, store: Store) -> None:
        """Walk on (up to SCAN_STEPS steps) and take in the keys not seen before.

        Raises StoreError if Redis fails."""
        fresh: list[str] = []
        for _ in range(SCAN_STEPS):
            self._cursor, batch = await records.find_page(
                store, self.db, self.pattern, self._cursor, SCAN_COUNT
            )
            fresh.extend(k for k in batch if k not in self._seen)
            self._seen.update(batch)
            if self._cursor == 0:  # a walk is over; the next refresh starts another
                break
        if fresh:
            rows = await records.read_fields(store, self.db, fresh, ["created_at"])
            for key, row in zip(fresh, rows, strict=True):
                self._insert(key, _int(row.get("created_at")))

    def _insert(self, key: str, created_at: int) -> None:
        bisect.insort(self._newest, (created_at, key))
        if len(self._newest) > self.keep:
            del self._newest[0]

    def forget(self, key: str) -> None:
        """``key`` is gone (deleted, or expired): no longer among the newest."""
        self._newest = [entry for entry in self._newest if entry[1] != key]
        self._seen.discard(key)


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0
