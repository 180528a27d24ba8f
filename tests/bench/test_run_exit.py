"""A bench run that lost a case fails (bench/run.py): CI's smoke run (``--quick``) is only a
check if a case that raised makes the process exit non-zero, and a ratio over a zero base is
a failed case, not a ``ZeroDivisionError`` printed and forgotten."""

from __future__ import annotations

import pytest

from bench.cases import _positive
from bench.harness import Row
from bench.run import exit_status, run_listed


async def _fine(number: int) -> list[Row]:
    return [Row(f"{number} fine", "jobs/s", "jobs/s", [1.0])]


async def _broken(number: int) -> list[Row]:
    return [Row(f"{number} x", "ratio", "%", [100 / _positive(0.0, "base rate")])]


async def test_a_case_that_raises_fails_the_run_and_the_next_case_still_runs() -> None:
    failed: list[int | str] = []
    rows = await run_listed(7, _broken, failed)
    rows += await run_listed(9, _fine, failed)
    assert failed == [7]
    assert [r.case for r in rows] == ["7 FAILED", "9 fine"]
    assert rows[0].metric == "ValueError"
    assert "base rate is 0.0" in rows[0].note
    assert exit_status(failed) == 1


async def test_a_run_whose_cases_all_ran_exits_zero() -> None:
    failed: list[int | str] = []
    for number in (1, 2):
        await run_listed(number, _fine, failed)
    assert failed == []
    assert exit_status(failed) == 0


@pytest.mark.parametrize("base", [0.0, float("nan"), -1.0])
def test_a_ratio_has_no_base_that_is_not_positive(base: float) -> None:
    with pytest.raises(ValueError, match="no ratio"):
        _positive(base, "base rate")
    assert _positive(2.5, "base rate") == 2.5
