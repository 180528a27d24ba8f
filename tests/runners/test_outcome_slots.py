"""A runner slot's outcome file (node/slot/outcomes.py: SlotFile, unpack_slot): the outcome
of the attempt being ended, kept with one write per job, and turned into the attempt's own
outcome file when the slot is recovered."""

from __future__ import annotations

import os
from pathlib import Path

from node.slot import outcomes


def _slot(run_dir: Path) -> outcomes.SlotFile:
    outcomes.outcome_dir(run_dir).mkdir(parents=True)
    return outcomes.SlotFile(outcomes.slot_path(run_dir, 1, "python-0"))


def test_a_kept_outcome_becomes_the_attempt_s_own_file(tmp_path: Path) -> None:
    slot = _slot(tmp_path)
    named = outcomes.outcome_path(tmp_path, 1, "job:1:5", 2)
    slot.keep(named.name, {"exit_code": 3, "reason": "timeout: killed after 1 s"})
    assert outcomes.unpack_slot(tmp_path, 1, "python-0") == named.name
    assert outcomes.read_outcome(named) == {"exit_code": 3, "reason": "timeout: killed after 1 s"}
    assert outcomes.slot_path(tmp_path, 1, "python-0").read_bytes() == b""
    assert outcomes.unpack_slot(tmp_path, 1, "python-0") is None  # nothing twice


def test_a_shorter_record_over_a_longer_one_reads_whole(tmp_path: Path) -> None:
    slot = _slot(tmp_path)
    slot.keep(outcomes.outcome_name(1, "job:1:1", 1), {"exit_code": 1, "stdout": "x" * 500})
    short = outcomes.outcome_path(tmp_path, 1, "job:1:2", 1)
    slot.keep(short.name, {"exit_code": 0})
    # one write per record, none to shorten the file: it stays as long as the longest
    assert os.path.getsize(slot.path) > 500
    assert outcomes.unpack_slot(tmp_path, 1, "python-0") == short.name
    assert outcomes.read_outcome(short) == {"exit_code": 0}
    assert not outcomes.outcome_path(tmp_path, 1, "job:1:1", 1).exists()


def test_a_recorded_end_leaves_nothing_to_adopt(tmp_path: Path) -> None:
    slot = _slot(tmp_path)
    named = outcomes.outcome_path(tmp_path, 1, "job:1:5", 1)
    slot.keep(named.name, {"exit_code": 0})
    slot.clear()
    assert outcomes.unpack_slot(tmp_path, 1, "python-0") is None
    assert not named.exists()
    slot.keep(named.name, {"exit_code": 4})  # the next job, after the emptying
    assert outcomes.unpack_slot(tmp_path, 1, "python-0") == named.name
    assert outcomes.read_outcome(named) == {"exit_code": 4}


def test_an_attempt_s_own_file_written_later_wins(tmp_path: Path) -> None:
    """A runner whose end Valkey refused writes the attempt's file itself, with the output."""
    slot = _slot(tmp_path)
    named = outcomes.outcome_path(tmp_path, 1, "job:1:5", 1)
    slot.keep(named.name, {"exit_code": 0})
    outcomes.write_outcome(named, {"exit_code": 0, "stdout": "out", "stderr": ""}, durable=True)
    assert outcomes.unpack_slot(tmp_path, 1, "python-0") == named.name
    assert outcomes.read_outcome(named) == {"exit_code": 0, "stdout": "out", "stderr": ""}


def test_what_is_not_a_record_is_dropped(tmp_path: Path) -> None:
    _slot(tmp_path)
    path = outcomes.slot_path(tmp_path, 1, "python-0")
    path.parent.mkdir(parents=True, exist_ok=True)
    bad = [
        b'{"file": "1-job:1:5-1", "outc',
        b'{"file": "../../secrets/x-1-1", "outcome": {"exit_code": 0}}',
        b'{"file": "1-job:1:5-1", "outcome": {"exit_code": "0"}}',
        b'["1-job:1:5-1"]',
        b"\xff\xfe",
    ]
    for text in bad:
        path.write_bytes(text)
        assert outcomes.unpack_slot(tmp_path, 1, "python-0") is None, text
        assert path.read_bytes() == b""
    assert list(outcomes.outcome_dir(tmp_path).iterdir()) == []
    assert outcomes.unpack_slot(tmp_path, 2, "sh-0") is None  # no file: a slot that never ran


def test_a_recorded_end_blanks_a_short_record_and_truncates_a_long_one(tmp_path: Path) -> None:
    """Blanks over a short record (one pwrite; an ftruncate of a file with data journals its
    inode: bench/HISTORY.md#runner-syscalls) read as no outcome; a record longer than
    BLANKED_MAX is truncated away, so that it does not pad every later record."""
    slot = _slot(tmp_path)
    named = outcomes.outcome_path(tmp_path, 1, "job:1:5", 1)
    slot.keep(named.name, {"exit_code": 0})
    size = os.path.getsize(slot.path)
    slot.clear()
    assert slot.path.read_bytes() == b" " * size
    assert outcomes.unpack_slot(tmp_path, 1, "python-0") is None
    assert not named.exists()

    big = {"exit_code": 0, "stdout": "x" * outcomes.BLANKED_MAX}
    slot.keep(outcomes.outcome_name(1, "job:1:6", 1), big)
    slot.clear()
    assert os.path.getsize(slot.path) == 0
    slot.keep(named.name, {"exit_code": 4})
    assert os.path.getsize(slot.path) < 100  # not padded to the long one
    assert outcomes.unpack_slot(tmp_path, 1, "python-0") == named.name
    assert outcomes.read_outcome(named) == {"exit_code": 4}
