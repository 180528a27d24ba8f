"""A history checker in the manner of Jepsen's ``total-queue``, for jobs instead of queue items.

A history is what a test saw: the jobs whose submission was acknowledged (the origin stored
them), the final status each one's client was told, and the executions the scripts themselves
recorded (one line per run, with the job's tag). Every acknowledged job must end exactly once:

- lost: acknowledged, never told a final status, or told ``finished`` without having run;
- duplicated: ran more than once;
- unexpected: ran, but no acknowledged job has that tag;
- told failed but ran: its client was told ``error`` and it ran all the same.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class Verdict:
    acknowledged: int = 0
    finished: int = 0
    failed: int = 0  # told error, and did not run: allowed (a refusal, a timeout)
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    told_failed_but_ran: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.unexpected or self.told_failed_but_ran)

    def counters(self) -> str:
        return (
            f"acknowledged {self.acknowledged}, finished {self.finished}, failed {self.failed}; "
            f"lost {len(self.lost)}, duplicated {len(self.duplicated)}, "
            f"unexpected {len(self.unexpected)}, told-failed-but-ran "
            f"{len(self.told_failed_but_ran)}"
        )


def check_history(
    acknowledged: Iterable[str], told: Mapping[str, str], executions: Iterable[str]
) -> Verdict:
    """``acknowledged``: tags of the jobs submitted; ``told``: tag -> the final status its
    client got ("finished" or "error"; absent: none); ``executions``: one tag per run."""
    runs = Counter(executions)
    tags = list(acknowledged)
    verdict = Verdict(acknowledged=len(tags))
    for tag in tags:
        status, ran = told.get(tag), runs.get(tag, 0)
        if ran > 1:
            verdict.duplicated.append(tag)
        if status == "error":
            if ran:
                verdict.told_failed_but_ran.append(tag)
            else:
                verdict.failed += 1
        elif status == "finished" and ran:
            verdict.finished += 1
        else:  # no answer, an unknown status, or finished without a run
            verdict.lost.append(tag)
    known = set(tags)
    verdict.unexpected = sorted(tag for tag in runs if tag not in known)
    return verdict
