"""A circuit breaker as a pure state machine (fractor's circuit breaker): no I/O, no clock of
its own; every transition takes the time it happens at, so tests drive it with any clock.

- **closed**: attempts go; ``failures`` consecutive failures (``threshold`` of them) open it.
- **open**: attempts are refused until ``open_s`` after it opened; then it is half-open.
- **half-open**: at most ``probes`` attempts go at once; a success closes the breaker, a
  failure opens it again for another ``open_s``.

A success in any state closes it (the peer answered). A probe that ends with no verdict (a job
stopped, or given back at shutdown) is :meth:`released`: it frees its place. Each method
returns the new breaker and leaves the old one as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerConfig:
    threshold: int = 5  # consecutive failures that open the breaker (>= 1)
    open_s: float = 10.0  # how long it stays open before probes may go
    probes: int = 1  # attempts allowed at once while half-open (>= 1)


@dataclass(frozen=True)
class Breaker:
    config: BreakerConfig = BreakerConfig()
    failures: int = 0  # consecutive, since the last success
    opened_at: float | None = None  # when it last opened; None while closed
    probing: int = 0  # probes under way (half-open)

    def state(self, now: float) -> BreakerState:
        if self.opened_at is None:
            return BreakerState.CLOSED
        if now < self.opened_at + self.config.open_s:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def probe_at(self) -> float | None:
        """When an attempt may go again (None: now, the breaker is closed)."""
        return None if self.opened_at is None else self.opened_at + self.config.open_s

    def attempt(self, now: float) -> tuple[bool, Breaker]:
        """Whether an attempt may start now, and the breaker counting it (a probe, if
        half-open: it must end in :meth:`succeeded` or :meth:`failed`)."""
        state = self.state(now)
        if state is BreakerState.CLOSED:
            return True, self
        if state is BreakerState.OPEN or self.probing >= max(1, self.config.probes):
            return False, self
        return True, replace(self, probing=self.probing + 1)

    def succeeded(self, now: float) -> Breaker:
        return Breaker(self.config)

    def released(self, now: float) -> Breaker:
        """A probe ended with no verdict: another may go."""
        return replace(self, probing=max(0, self.probing - 1))

    def failed(self, now: float) -> Breaker:
        failures = self.failures + 1
        state = self.state(now)
        if state is BreakerState.HALF_OPEN or (
            state is BreakerState.CLOSED and failures >= max(1, self.config.threshold)
        ):
            return Breaker(self.config, failures, opened_at=now)
        # open: a failure seen while open (a late one) keeps the time it opened
        return replace(self, failures=failures)
