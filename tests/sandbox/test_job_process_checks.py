"""The warm job process's checks after each job, by what it holds open instead of looking
anew (node/sandbox/inner.py ``_Warm``): its count of open files read from its fd dir held
open, /dev/null for fds 0-2 from a file held open, /tmp seen empty by its size. A job that puts
another file in place of a held one gets the next job a fresh process; a job's files in /tmp,
however made, never meet the next job.

Each test has its control: the same probe shows the process was shared where nothing was left.
"""

from __future__ import annotations

from pathlib import Path

from tests.sandbox.test_sandbox import _box, _run, needs_root
from tests.sandbox.test_sandbox_warm import _marks

pytestmark = needs_root

# a file left open, hidden: the held fd dir, whose size the worker reads as the count of open
# files, swapped for a file of the size that count had before (the swap itself is what is seen)
HIDDEN_FILE = (
    "import builtins, os\n"
    "me = f'/proc/{os.getpid()}/fd'\n"
    "links = {n: f'/proc/self/fd/{n}' for n in os.listdir('/proc/self/fd')}\n"
    "held = [int(n) for n, p in links.items() if os.path.exists(p) and os.readlink(p) == me]\n"
    "count = os.fstat(held[0]).st_size\n"
    "builtins.kept = open(os.path.join(os.environ['HOME'], 'kept'), 'w')\n"
    "forged = os.open('/tmp/count', os.O_RDWR | os.O_CREAT, 0o600)\n"
    "os.write(forged, b'x' * count)\n"
    "for fd in held:\n"
    "    os.dup2(forged, fd)\n"
    "os.close(forged)\n"
    "print(len(held), count)\n"
)

# a file put in place of the held /dev/null: no more files open than before, but without the
# check the next job would read it as its stdin
SWAPPED_NULL = (
    "import os\n"
    "secret = os.open(os.path.join(os.environ['HOME'], 'secret'), os.O_RDWR | os.O_CREAT)\n"
    "os.write(secret, b'SECRET')\n"
    "os.lseek(secret, 0, os.SEEK_SET)\n"
    "links = {n: f'/proc/self/fd/{n}' for n in os.listdir('/proc/self/fd') if int(n) > 2}\n"
    "null = [n for n, p in links.items() if os.path.exists(p) and os.readlink(p) == '/dev/null']\n"
    "held = [int(n) for n in null]\n"
    "for fd in held:\n"
    "    os.dup2(secret, fd)\n"
    "os.close(secret)\n"
    "print(len(held))\n"
)
STDIN = (
    "import builtins, sys\n"
    "print(getattr(builtins, 'hero_mark', None), repr(sys.stdin.read()))\n"
    "builtins.hero_mark = 'stdin'\n"
)


def test_a_job_that_hides_an_open_file_from_the_count_gets_the_next_job_a_fresh_one(
    tmp_path: Path,
) -> None:
    box, _ = _box(tmp_path, "strict")
    try:
        _marks(box, tmp_path)
        reply, out, err = _run(box, tmp_path, HIDDEN_FILE, "python")
        after, _ = _marks(box, tmp_path)
        control, _ = _marks(box, tmp_path)
    finally:
        box.stop()
    assert reply["exit_code"] == 0, err
    assert out.split()[0] == "1"  # it found the held fd dir and put its forgery there
    assert after == "None"
    assert control != "None"


def test_a_job_that_swaps_the_held_dev_null_gets_the_next_job_a_fresh_one(
    tmp_path: Path,
) -> None:
    box, _ = _box(tmp_path, "strict")
    try:
        _marks(box, tmp_path)
        reply, out, err = _run(box, tmp_path, SWAPPED_NULL, "python")
        _, after, _ = _run(box, tmp_path, STDIN, "python")
        _, control, _ = _run(box, tmp_path, STDIN, "python")
    finally:
        box.stop()
    assert reply["exit_code"] == 0, err
    assert out.strip() == "1"
    assert after.split() == ["None", "''"]  # a fresh process, and nothing on its stdin
    assert control.split() == ["stdin", "''"]


# files in /tmp every way a job can make one: a nested tree, a link, a symlink, a fifo, a
# file renamed out of a dir that is then removed, an empty dir
LEAVE_IN_TMP = (
    "import os\n"
    "os.makedirs('/tmp/a/b/c')\n"
    "open('/tmp/a/b/c/deep', 'w').write('x')\n"
    "open('/tmp/a/top', 'w').write('x')\n"
    "os.link('/tmp/a/top', '/tmp/linked')\n"
    "os.symlink('/tmp/a/top', '/tmp/sym')\n"
    "os.mkfifo('/tmp/a/b/fifo')\n"
    "os.mkdir('/tmp/gone')\n"
    "open('/tmp/gone/moved', 'w').write('x')\n"
    "os.rename('/tmp/gone/moved', '/tmp/a/b/moved')\n"
    "os.rmdir('/tmp/gone')\n"
    "os.mkdir('/tmp/empty')\n"
)
# what a job may leave in /tmp: not below a mount point, where the project's read-only bind
# sits when its checkout is under /tmp (a CI clone): its thousands of files are no job's, and
# walking them grows the process a job is judged by
LIST_TMP = (
    "import builtins, os\n"
    "seen = []\n"
    "for d, ds, fs in os.walk('/tmp'):\n"
    "    ds[:] = [n for n in ds if not os.path.ismount(os.path.join(d, n))]\n"
    "    seen += [os.path.join(d, n) for n in ds + fs]\n"
    "print(getattr(builtins, 'hero_mark', None) is not None, sorted(seen))\n"
)


def test_what_a_job_leaves_in_tmp_is_gone_for_the_next_job_in_the_same_process(
    tmp_path: Path,
) -> None:
    box, _ = _box(tmp_path, "strict")
    try:
        _marks(box, tmp_path)
        _, before, _ = _run(box, tmp_path, LIST_TMP, "python")
        reply, _, err = _run(box, tmp_path, LEAVE_IN_TMP, "python")
        _, after, _ = _run(box, tmp_path, LIST_TMP, "python")
    finally:
        box.stop()
    assert reply["exit_code"] == 0, err
    assert before.startswith("True ")
    assert after == before  # the same process, and /tmp as it was before the job


def test_a_failing_python_job_prints_its_traceback_and_the_process_serves_on(
    tmp_path: Path,
) -> None:
    """The traceback a failing job prints is the interpreter's own (the worker imports no
    traceback module): the whole chain, on the job's stderr; the next job keeps the process."""
    failing = (
        "def inner():\n"
        "    return {}['missing']\n"
        "try:\n"
        "    inner()\n"
        "except KeyError as exc:\n"
        "    raise ValueError('wrapped') from exc\n"
    )
    box, _ = _box(tmp_path, "strict")
    try:
        _marks(box, tmp_path)
        reply, _, err = _run(box, tmp_path, failing, "python")
        after, _ = _marks(box, tmp_path)
    finally:
        box.stop()
    assert reply["exit_code"] == 1
    lines = err.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert '  File "<job>", line 2, in inner' in lines
    assert "KeyError: 'missing'" in lines
    assert "The above exception was the direct cause of the following exception:" in lines
    assert lines[-1] == "ValueError: wrapped"
    assert after != "None"
