"""One option scheme (``--actor``, ``--key``, ``--context``) with the old spellings hidden
but accepted, and shell completion."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from node.cli.main import build_parser
from tests.cli.test_cli import ROOT, cli


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["init", "--actor-id", "4"], "actor_id", 4),
        (["init", "--actor", "4"], "actor_id", 4),
        (["actor", "add", "--id", "3", "--pubkey", "ab"], "actor_id", 3),
        (["actor", "add", "--actor", "3", "--pubkey", "ab"], "actor_id", 3),
        (["job", "stop", "job:1:2", "--key-file", "k"], "key_file", "k"),
        (["job", "stop", "job:1:2", "--key", "k"], "key_file", "k"),
        (["job", "submit", "--script", "1", "--key", "k"], "key_file", "k"),
        (["flow", "submit", "f.json", "--key", "k"], "key_file", "k"),
    ],
)
def test_old_and_new_spellings_mean_the_same(argv, dest, value):
    args = build_parser().parse_args(argv)
    assert str(getattr(args, dest)) == str(value)


def test_old_spellings_are_hidden_from_the_help(tmp_path):
    for argv, old, new in (
        (["init", "--help"], "--actor-id", "--actor"),
        (["actor", "add", "--help"], "--id", "--actor"),
        (["job", "stop", "--help"], "--key-file", "--key"),
    ):
        shown = cli(tmp_path, *argv)
        assert shown.returncode == 0
        assert re.search(rf"(?<![\w-]){new}\b", shown.stdout)
        assert not re.search(rf"(?<![\w-]){old}\b", shown.stdout), shown.stdout


def test_completion_prints_shell_code_and_completes(tmp_path):
    code = cli(tmp_path, "completion", "bash")
    assert code.returncode == 0
    assert "complete " in code.stdout
    assert "hero-node" in code.stdout
    out = tmp_path / "completions.txt"
    env = os.environ | {
        "_ARGCOMPLETE": "1",
        "COMP_LINE": "hero-node job submit --ti",
        "COMP_POINT": str(len("hero-node job submit --ti")),
        "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
    }
    done = subprocess.run(
        [sys.executable, "-m", "node.cli"], env=env, cwd=ROOT, capture_output=True, check=False
    )
    assert done.returncode == 0
    assert out.read_text().split("\v") == ["--timeout "]
