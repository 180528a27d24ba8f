"""The one schedule of an end written while Valkey is away: the outcome of an attempt exists
only in the process that holds it (running the job again instead would run it twice), so its
end is tried again, after 0.2 s, doubling to 5 s, until Valkey takes it. The runner process
(sync) and the node (trio) each sleep in their own way; what they wait and what they say is
decided here."""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

FIRST_S = 0.2
MOST_S = 5.0


@dataclass
class Away:
    """The waits between the tries of one end: call :meth:`failed` after each failed try."""

    job_key: str
    next_s: float = FIRST_S
    tries: int = 0

    def failed(self, exc: BaseException, logger: logging.Logger = log, **extra: object) -> float:
        """Say that the end of ``job_key`` could not be recorded (``exc``), and how long to wait
        before the next try."""
        self.tries += 1
        logger.warning(
            "%s: cannot record the outcome yet (%r); retrying", self.job_key, exc, extra=extra
        )
        wait_s, self.next_s = self.next_s, min(self.next_s * 2, MOST_S)
        return wait_s
