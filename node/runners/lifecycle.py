"""What happens to a job after an attempt: pure decisions, no I/O.

An attempt ends ``finished`` or ``error``. An error is retried, after an exponential backoff with
jitter, while the job has retries left; a job that was stopped, or whose type has no runner, is
never retried. ``runner_lost`` (the process running it died) counts as a failed attempt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bus.models import JobStatus
from bus.reasons import Reason

NEVER_RETRY = (Reason.STOPPED, Reason.UNKNOWN_SCRIPT_TYPE)
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 60.0


@dataclass(frozen=True)
class Next:
    retry: bool
    delay_s: float = 0.0


def after_attempt(
    status: JobStatus,
    reason: str,
    attempt: int,
    retries: int,
    *,
    base_s: float = BACKOFF_BASE_S,
    rand: random.Random | None = None,
) -> Next:
    """Decide whether attempt number ``attempt`` (1-based) of a job with ``retries`` is retried."""
    if status is JobStatus.FINISHED or attempt > retries or reason.startswith(NEVER_RETRY):
        return Next(retry=False)
    return Next(retry=True, delay_s=backoff_s(attempt, base_s=base_s, rand=rand))


def backoff_s(
    attempt: int, *, base_s: float = BACKOFF_BASE_S, rand: random.Random | None = None
) -> float:
    """Exponential backoff with full jitter in [d/2, d], d = base * 2**(attempt-1), capped."""
    ceiling = min(BACKOFF_MAX_S, base_s * 2 ** max(0, attempt - 1))
    return ceiling * (0.5 + 0.5 * (rand or random).random())
