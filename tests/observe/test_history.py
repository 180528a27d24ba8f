"""The history checker of the partition suite (tests/history.py) on histories made by hand."""

from __future__ import annotations

from tests.history import check_history


def test_a_clean_history_passes():
    verdict = check_history(["a", "b", "c"], {"a": "finished", "b": "finished", "c": "error"}, "ab")
    assert verdict.ok
    assert (verdict.acknowledged, verdict.finished, verdict.failed) == (3, 2, 1)


def test_each_anomaly_is_named():
    verdict = check_history(
        ["lost", "never_ran", "twice", "failed_ran"],
        {"never_ran": "finished", "twice": "finished", "failed_ran": "error"},
        ["twice", "twice", "failed_ran", "stranger"],
    )
    assert not verdict.ok
    assert verdict.lost == ["lost", "never_ran"]
    assert verdict.duplicated == ["twice"]
    assert verdict.unexpected == ["stranger"]
    assert verdict.told_failed_but_ran == ["failed_ran"]
    assert "lost 2, duplicated 1, unexpected 1, told-failed-but-ran 1" in verdict.counters()


def test_one_anomaly_alone_fails_the_history():
    base = {"a": "finished"}
    assert not check_history(["a"], {}, ["a"]).ok  # ran, never answered
    assert not check_history(["a"], base, ["a", "a"]).ok
    assert not check_history(["a"], base, ["a", "b"]).ok
    assert not check_history(["a"], {"a": "error"}, ["a"]).ok
    assert check_history(["a"], base, ["a"]).ok
