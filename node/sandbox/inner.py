"""The worker inside a sandbox: runs the jobs of one runner slot, one at a time, for as long as
the runner keeps it (node/sandbox/host.py). Standard library only, and nothing of the node is
imported: this process holds no secret and is started by exec of a fresh interpreter.

Protocol on fd 0 (a unix stream socket to the runner), frames of a 4-byte big-endian length
and JSON: the worker says ``{"ready": true}``; then per job the runner sends a request with two
open files attached (SCM_RIGHTS: the job's stdout and stderr) and the worker answers how the
job ended: ``{"exit_code": n | null, "signal": s, "cpu_s": t}``. What every job of the worker
is set up with (its cwd, rlimits, the runner's pid namespace) comes once, as JSON in argv after
``--warm``/``--fresh`` and the pid namespace (the dirs emptied after each job follow it); a
request holds the job's own (its script, environment, kind, command), and any key of its own
goes over those settings.

A warm worker also takes a batch: ``{"jobs": [request, ...]}`` with two files per
job, run one after another, each with the settings under its own request and answered as it
ends, its answer naming its place (``"i": n``). What one job leaves that the next must not
meet (see ``--warm``) ends the batch there, its answer saying ``"resend": true``: the runner
sends the rest again, none of them ran. A job that ends the job process is answered for by
this worker with ``"lost": true``: the jobs after it never ran (the runner gives them back).
A ``{"stop": true}`` frame from the runner while a batch runs (its node died: it answers only
what it has begun) stops it before the next job, answered ``{"i": n, "unrun": true}``.

Two ways to run the jobs (``[sandbox] fresh_process``, argv ``--warm`` or ``--fresh``):

``--warm`` (the default): one job process, forked from this warm interpreter before any request
came, runs job after job: a python job in that process itself (no process launch per job), any
other type by posix_spawn of its command. It reads each request itself, so this worker never
holds a script or an environment. Per job it has the job's rlimits, umask 077, the cwd, the
environment, the job's stdout/stderr on fds 1/2 (/dev/null again after the job), and kills
what the job left running; it replaces itself (exit RECYCLE, then a fresh fork of this worker)
after a job that left a thread, an open file, a changed limit, signal handler or timer, half
its memory limit mapped or a standard stream closed, and once it used CPU_BUDGET_S of CPU (its
CPU limit counts its whole life). A job that ends the process (os._exit, a signal, a limit) is
answered for by this worker, from the process's wait status. Jobs of one context that share
the process can see traces of each other (modules, globals, the socket to the runner); the
runner starts one sandbox per context, so other contexts' jobs never share it.

``--fresh``: each job runs in a fresh process of its own session, forked from this warm
interpreter before the job's request comes (off the job's way): that process, not this worker,
reads the request, so no job's process holds an earlier job's script or environment. A python
job runs there (its script in a fresh namespace), any other type by exec of its command.
Before the job's code runs, that process sets the job's rlimits, umask 077, its cwd (the work
dir), its environment, and closes every fd but 0/1/2.

After every job, in both ways, every process it left in the sandbox (its pid namespace: a
setsid daemon cannot leave it) is killed, and the answer waits until each has exited (a process
that holds much memory takes a while to end); under isolation "none" only its process group
and the orphans it left are (there is no namespace to sweep). Then the dirs named after the
pid namespace in argv (the sandbox's /tmp, and the work dir under ``work_dir = "per_job"``) are
emptied: a job's files there never meet the next job; the answer says ``"left": n`` if n
entries could not be removed (the runner then replaces the sandbox, and its /tmp with it).
"""

from __future__ import annotations

import _signal  # getsignal without signal's enum conversion: 1 us for all, not 26
import _socket  # without socket.py's enums: ~4 ms less of each worker's start
import ctypes
import functools
import gc
import json
import mmap
import os
import resource
import select
import signal
import stat
import struct
import sys
import time

TYPE_CHECKING = False  # typing's import (~2.4 ms of each worker's start) for the checker only
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import CodeType
    from typing import Any

# what each job is set up with besides its own request (cwd, rlimits, the runner's pid
# namespace), from the runner once, in argv: a request's own keys go over them
SETTINGS: dict[str, Any] = {}
EMPTIED: list[str] = []  # the dirs emptied after each job (argv, after the settings)
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_MAX_FRAME = 64 * 1024 * 1024
_FIRST_READ = 64 * 1024
MAX_BATCH = 64  # jobs in one request: two fds each, within SCM_RIGHTS' 253 per message
_FDS_SPACE = _socket.CMSG_LEN(2 * MAX_BATCH * 4)


def _read_exact(sock: _socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _recv_fds(sock: _socket.socket) -> tuple[bytes, list[int]]:
    """What one recvmsg reads, and the fds that came with it (socket.recv_fds's way)."""
    data, ancillary, _flags, _addr = sock.recvmsg(_FIRST_READ, _FDS_SPACE)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            n = len(payload) // 4
            fds += struct.unpack(f"{n}i", payload[: 4 * n])
    return data, fds


def receive(sock: _socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request and the fds sent with it (the runner sends one at a time, in one send:
    mostly one recvmsg reads all of it)."""
    data, fds = _recv_fds(sock)
    if not data:
        raise EOFError
    if len(data) < 4:
        data += _read_exact(sock, 4 - len(data))
    (size,) = struct.unpack(">I", data[:4])
    if size > _MAX_FRAME or len(data) > 4 + size:
        raise EOFError
    if len(data) < 4 + size:
        data += _read_exact(sock, 4 + size - len(data))
    return _loads(data[4:]), fds


# the C scanner of json.loads without its Python layers (an encoding sniffed, a regular
# expression run twice for whitespace): ~30 us less of a lone job's path here, with cold caches
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(data: bytes) -> Any:
    """The JSON value ``data`` is (as the runner writes it: UTF-8, no whitespace around);
    ValueError if it is not one, or has anything after it."""
    text = data.decode()
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(text):
        raise ValueError("more than one JSON value")
    return value


def _unencodable(value: object) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


# json.dumps's C encoder, made once (json.dumps makes one per call, through three Python
# layers); no check for circular values: an answer is a flat dict
_ENCODE = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, _unencodable, json.encoder.encode_basestring_ascii, None, ": ", ", ", False, False, True
)


def send(sock: _socket.socket, value: dict[str, Any]) -> None:
    data = "".join(_ENCODE(value, 0)).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def _limit(rlimits: list[list[Any]]) -> None:
    for name, soft, hard in rlimits:
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError):  # above a hard limit set from outside: keep that one
            _, cur_hard = resource.getrlimit(getattr(resource, name))
            resource.setrlimit(getattr(resource, name), (min(soft, cur_hard), cur_hard))


def _compiled(script: str) -> CodeType:
    return compile(script, "<job>", "exec")


def _replace_environ(env: dict[str, str]) -> None:
    """``os.environ`` (and the C environment under it) becomes ``env``: only the variables
    that differ are set or removed (clear() and update() took ~48 us for 8 variables, this
    ~14 us: the jobs of a context mostly differ in a variable or two)."""
    environ = os.environ
    for name in [n for n in environ if n not in env]:
        del environ[name]
    for name, value in env.items():
        if environ.get(name) != value:
            environ[name] = value


def _python(
    script: str, env: dict[str, str], compiled: Callable[[str], CodeType] = _compiled
) -> int:
    _replace_environ(env)
    sys.argv = ["<job>"]
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compiled(script), namespace)  # noqa: S102 - running jobs is the point
        return 0
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF
        print(code, file=sys.stderr)
        return 1
    except MemoryError:  # the traceback may itself need memory: the mark the runner reads
        os.write(2, b"MemoryError\n")
        return 1
    except BaseException:  # noqa: BLE001 - any failure of the script is its exit status
        # what traceback.print_exc() prints, by the interpreter's own C printer: the worker
        # imports no traceback module (~4 ms of each start)
        sys.__excepthook__(*sys.exc_info())
        return 1


def _child(request: dict[str, Any], out: int, err: int) -> None:
    """In the job's process, its request just read: never returns."""
    code = 127
    try:
        script_file = request.get("script_file") or ""
        if script_file:
            with open(os.open(script_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(request["script"])
        stdin = _stdin(request, script_file)
        for fd, target in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
        os.closerange(3, 65536)
        # Python ignores both; an exec keeps ignored signals: the job gets the defaults back
        # (SIGXFSZ is how a file size limit ends it, with a certain reason)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        _limit(request["rlimits"])
        os.umask(0o077)
        os.chdir(request["cwd"])
        env = {str(k): str(v) for k, v in request["env"].items()}
        if request["kind"] == "python":
            code = _python(request["script"], env)
            sys.stdout.flush()
            sys.stderr.flush()
        else:
            argv = [str(a) for a in request["argv"]]
            os.execvpe(argv[0], argv, env)
    except MemoryError:
        os.write(2, b"MemoryError\n")
        code = 1
    except OSError as exc:
        os.write(2, f"cannot start {request.get('argv', ['?'])[0]}: {exc}\n".encode())
    os._exit(code)


def _stdin(request: dict[str, Any], script_file: str) -> int:
    """A command reads its script from stdin unless it is given a script file; python jobs
    and the others read nothing."""
    if request["kind"] == "python" or script_file:
        return os.open(os.devnull, os.O_RDONLY)
    fd = os.memfd_create("job-script")
    os.write(fd, request["script"].encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _next_job(sock: _socket.socket, note: int) -> None:
    """The next job's process, forked before its request comes: it reads the request itself
    (the worker never holds a job's script or environment), tells the worker what it needs
    after the job, then becomes the job. Never returns."""
    try:
        os.setsid()
        given, fds = receive(sock)
        request = SETTINGS | given
        if len(fds) != 2:
            raise EOFError
        after = f"{request.get('script_file') or ''}\0{request.get('outer_pidns', '')}"
        os.write(note, after.encode())  # < PIPE_BUF: one write
        os.close(note)
    except (EOFError, ConnectionError, ValueError):  # the runner is gone, or spoke nonsense
        os._exit(0)
    _child(request, fds[0], fds[1])


def serve_one(sock: _socket.socket) -> bool:
    """Run the next job in a fresh process, sweep what it left and answer how it ended.
    False if no job came (the runner closed the socket or sent what is not a request)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(rfd)
            _next_job(sock, wfd)
        finally:  # what escapes the job's setup must not unwind into the worker's loop
            os._exit(127)
    os.close(wfd)
    # the job's process closes its end before the job's code runs: the job cannot write here
    note = b""
    while chunk := os.read(rfd, 4096):
        note += chunk
    os.close(rfd)
    _pid, status, usage = os.wait4(pid, 0)
    if not note:
        return False
    script_file, _, outer_pidns = note.decode().partition("\0")
    end_leftovers((os.getpid(),), outer_pidns, of=pid)  # setsid made it its group leader
    if script_file:
        with _quiet():
            os.unlink(script_file)
    left = empty_dirs(EMPTIED)
    send(sock, _ending(status, usage.ru_utime + usage.ru_stime) | _left(left))
    return True


def _left(left: int) -> dict[str, int]:
    return {"left": left} if left else {}


def empty_dirs(paths: list[str]) -> int:
    """Remove what is in each of ``paths`` on its own file system (a mount below, such as an
    interpreter bound under /tmp, is left alone, with the dirs leading to it); how many
    entries could not be removed."""
    left = 0
    for path in paths:
        try:
            dev = os.lstat(path).st_dev
        except OSError:
            continue
        left += _empty(path, dev)
    return left


def _empty(path: str, dev: int) -> int:
    """How many entries of ``path`` are left once it is emptied. Iterative: a job's deep
    tree must not exhaust this process's stack."""
    left, stack, dirs = 0, [path], []
    holds_mount: set[str] = set()
    while stack:
        where = stack.pop()
        try:
            entries = list(os.scandir(where))
        except OSError:
            left += 1
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_dev != dev:  # a mount point: not the job's
                holds_mount.update(_parents(entry.path, path))
            elif stat.S_ISDIR(st.st_mode):
                with _quiet():
                    os.chmod(entry.path, 0o700)  # a job's 000 dir is still emptied
                dirs.append(entry.path)
                stack.append(entry.path)
            else:
                try:
                    os.unlink(entry.path)
                except OSError:
                    left += 1
    for d in reversed(dirs):  # deepest first: found after their parents
        if d not in holds_mount:
            try:
                os.rmdir(d)
            except OSError:
                left += 1
    return left


def _parents(entry: str, top: str) -> list[str]:
    out, cur = [], os.path.dirname(entry)
    while len(cur) > len(top):
        out.append(cur)
        cur = os.path.dirname(cur)
    return out


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)  # type: ignore[arg-type]


def end_leftovers(spared: tuple[int, ...], outer_pidns: str, of: int) -> None:
    """Kill what a job left running. Only when this process is in a pid namespace of its own
    (not the runner's, ``outer_pidns``): every process of the sandbox but its init (pid 1) and
    ``spared``. Without one, /proc lists the whole host, where that would SIGKILL every process
    the worker's user may signal (isolation "none"): only the children and the process group
    of ``of`` but ``spared``. Each victim is waited for until it has exited, then the zombies
    this process is the parent of are reaped."""
    if _sweeps(outer_pidns):
        _kill_all(lambda: _live((1, *spared)))
    else:
        _kill_all(lambda: _live(spared, of=of))
    _reap()


SWEEP_WAIT_S = 5.0  # how long a sweep waits in all for its victims to end


def _kill_all(find: Callable[[], list[int]]) -> None:
    """SIGKILL what ``find`` lists and wait for it to exit, until ``find`` lists nothing.
    Bounded, rounds and wait: a fork bomb, or a process stuck in the kernel, must not keep the
    worker from answering."""
    deadline = time.monotonic() + SWEEP_WAIT_S
    for _ in range(100):
        left = find()
        if not left:
            return
        kill_and_wait(left, deadline)
        _reap()


def kill_and_wait(pids: list[int], deadline: float) -> None:
    """SIGKILL ``pids`` and wait, until ``deadline``, until each has exited. A killed process
    still shows in /proc (not yet a zombie) while it releases what it holds, its memory first:
    without the wait the next job would meet it. A pidfd also makes the kill immune to pid
    reuse; without pidfds, the kill alone."""
    poller, fds = select.poll(), []
    try:
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # gone already; or no pidfds here
                with _quiet():
                    os.kill(pid, signal.SIGKILL)
                continue
            fds.append(fd)
            with _quiet():
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            poller.register(fd, select.POLLIN)
        waiting = len(fds)
        while waiting and (left_s := deadline - time.monotonic()) > 0:
            for fd, _event in poller.poll(max(1, int(left_s * 1000))):
                poller.unregister(fd)
                waiting -= 1
    finally:
        for fd in fds:
            os.close(fd)


def _reap() -> None:
    """Reap the zombies this process is the parent of (they count as processes)."""
    with _quiet():  # ChildProcessError: none left
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass


@functools.cache
def _sweeps(outer_pidns: str) -> bool:
    """Whether this worker may kill every process it sees: it is in a pid namespace other
    than the runner's and that namespace's init is bwrap's. Neither changes while the worker
    lives (setns is refused; the namespace ends with its init): decided once, not per job."""
    try:
        own = os.readlink("/proc/self/ns/pid")
    except OSError:
        return False
    # Outside a sandbox's pid namespace /proc lists the whole host: killing "every process
    # but pid 1" there would kill the machine. Only the sandbox's init may be bwrap.
    return bool(outer_pidns) and own != outer_pidns and _own_pid_namespace()


def _own_pid_namespace() -> bool:
    """True only inside bwrap's pid namespace, where pid 1 is bwrap's own init."""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0]
    except OSError:
        return False
    return os.path.basename(argv0) == b"bwrap"


def _live(spared: tuple[int, ...], of: int = 0) -> list[int]:
    """The processes of the pid namespace, zombies and ``spared`` left out; with ``of``, only
    its children and the members of its process group."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in spared:
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                state, ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError, IndexError):
            continue
        if state != "Z" and (not of or of in (int(ppid), int(pgrp))):
            out.append(int(name))
    return out


# -- warm: one job process for many jobs -------------------------------------------------------

RECYCLE = 75  # the job process's exit status when it replaces itself after a job
CPU_BUDGET_S = 0.25  # the CPU a job process may use before it is replaced (RLIMIT_CPU)
_IDLE, _IN_JOB, _REPLYING = 0, 1, 2  # its phase, in the page it shares with the worker
_TIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)
# a handler a job sets for one of these would fire in a later job: a change replaces the process
_WATCHED = (
    signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGXCPU, signal.SIGXFSZ,
    signal.SIGPIPE, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
    signal.SIGUSR2, signal.SIGCHLD,
)  # fmt: skip


def serve_warm(sock: _socket.socket, outer_pidns: str) -> None:
    """The worker's loop: fork the job process, wait for it, answer for the job it died in.
    Returns when the runner is gone (the job process read the socket's end) or when an answer
    may have been cut (the runner then sees the sandbox end)."""
    # the job process's phase (byte 0), its batch index + 1 (bytes 4-7, 0: a lone request), the
    # CPU it had used when its job began (bytes 8-15)
    shared = mmap.mmap(-1, 16)
    while True:
        shared[0] = _IDLE
        pid = os.fork()
        if pid == 0:
            try:
                _job_process(sock, shared, outer_pidns)
            finally:  # nothing of the job process unwinds into this loop
                os._exit(127)
        _pid, status, usage = os.wait4(pid, 0)
        phase = shared[0]
        if phase == _IN_JOB:
            end_leftovers((os.getpid(),), outer_pidns, of=pid)
            (began,) = struct.unpack_from("d", shared, 8)
            (index,) = struct.unpack_from("I", shared, 4)
            left = empty_dirs(EMPTIED)
            ending = _ending(status, usage.ru_utime + usage.ru_stime - began) | _left(left)
            if index:  # the job process died in a batch's job: the jobs after it never ran
                ending |= {"i": index - 1, "lost": True}
            send(sock, ending)
        elif phase != _IDLE or not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == RECYCLE):
            return


def _ending(status: int, cpu: float) -> dict[str, Any]:
    if os.WIFSIGNALED(status):
        return {"exit_code": None, "signal": os.WTERMSIG(status), "cpu_s": cpu}
    return {"exit_code": os.WEXITSTATUS(status), "signal": 0, "cpu_s": cpu}


def _cpu() -> tuple[float, float]:
    """This process's CPU so far: its own, and its reaped children's (as wait4 reports it)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def _job_process(sock: _socket.socket, shared: mmap.mmap, outer_pidns: str) -> None:
    """The job process: its own session, a subreaper (what a job leaves running is its child
    and is seen), fds 0/1/2 /dev/null between jobs, the socket on fd 3; then job after job."""
    os.setsid()
    ctypes.CDLL(None).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    os.closerange(3, 65536)
    own = _socket.socket(fileno=os.dup(sock.fileno()))  # not inherited by a job's command
    _null_stdio()
    # the defaults a job's own process gets (SIGXFSZ is how a file size limit ends it)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    jobs = _Warm(shared, outer_pidns)
    while True:
        try:
            given, fds = receive(own)
        except (EOFError, ConnectionError, ValueError):  # the runner is gone, or spoke nonsense
            os._exit(0)
        request = SETTINGS | given
        batch = request.pop("jobs", None)
        if batch is None:
            batch = [request]
        elif not isinstance(batch, list) or not 0 < len(batch) <= MAX_BATCH:
            os._exit(0)
        if len(fds) != 2 * len(batch):
            os._exit(0)
        for i, job in enumerate(batch):
            if i and _stopped(own):  # the runner's node died: it answers the job it has, only
                send(own, {"i": i, "unrun": True})
                for fd in fds[2 * i :]:
                    os.close(fd)
                break
            # the batch's shared settings (cwd, rlimits) under each job's own request
            struct.pack_into("I", shared, 4, 0 if job is request else i + 1)
            jobs.held = 2 * (len(batch) - i - 1)  # the later jobs' files, open here meanwhile
            own_request = request if job is request else request | job
            reply, spoiled = jobs.run(own_request, fds[2 * i], fds[2 * i + 1])
            more = i + 1 < len(batch)
            # what the job left that the next must not meet: checked before the answer when
            # the rest of the batch waits on it (its resend), else once the answer is sent,
            # off the runner's way (~40 us of a lone job's path): the next request is read
            # only after the check, by this process or, spoiled, by its replacement
            spoiled = spoiled or (more and jobs.left_behind())
            if job is not request:
                reply["i"] = i
                # the rest of the batch never meets what this job left (in the process, or
                # in /tmp): the runner sends it again, to a new process or a new sandbox
                if more and (spoiled or "left" in reply):
                    reply["resend"] = True
            shared[0] = _REPLYING
            send(own, reply)
            shared[0] = _IDLE
            if not (spoiled or more):
                spoiled = jobs.left_behind()
            if spoiled or (more and reply.get("resend")):
                for fd in fds[2 * (i + 1) :]:
                    os.close(fd)
                os._exit(RECYCLE)


def _stopped(sock: _socket.socket) -> bool:
    """Whether the runner asked, between two jobs of a batch, that the rest not run (a
    ``{"stop": true}`` frame), or is gone."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        value, fds = receive(sock)
    except (EOFError, ConnectionError, ValueError):
        return True
    for fd in fds:
        os.close(fd)
    return True


def _null_stdio() -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def _file_id(fd: int) -> tuple[int, int, int]:
    stat = os.fstat(fd)
    return stat.st_dev, stat.st_ino, stat.st_rdev


def _fstype(path: str) -> str:
    """The type of the file system mounted last at ``path`` ("" if none is)."""
    found = ""
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            head, _, tail = line.partition(b" - ")
            fields = head.split()
            if len(fields) > 4 and fields[4] == os.fsencode(path):
                found = tail.split(b" ", 1)[0].decode()
    return found


def _empty_size(path: str) -> int | None:
    """The size ``path``, a tmpfs, has while it is empty; None if it is no tmpfs of its own or
    holds something now (a mount below it). A tmpfs directory's size counts its entries
    (``BOGO_DIRENT_SIZE`` each, every way one is made: a file, a dir, a link, a rename into
    it), so one lstat tells that the whole tree is empty: nothing can be below it then."""
    try:
        if _fstype(path) != "tmpfs" or empty_dirs([path]) or os.listdir(path):
            return None
        return os.lstat(path).st_size
    except OSError:
        return None


class _Warm:
    """The job process's jobs, and what it set for them, to see what a job changed."""

    def __init__(self, shared: mmap.mmap, outer_pidns: str) -> None:
        self.shared, self.outer_pidns = shared, outer_pidns
        self.limits: dict[str, tuple[int, int]] = {}
        # this process's stat, held open and read again per job (an open and a close less,
        # ~4 us of a job here); named by its inode, for a job may put another file there
        self.stat = os.open("/proc/self/stat", os.O_RDONLY | os.O_CLOEXEC)
        self.stat_id = _file_id(self.stat)
        # the count of its open files likewise: its fd dir's size (Linux >= 6.2), one fstat a
        # job where a listing took an open, two reads and a close (~8 us); else the listing
        self.fd_dir = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.fd_dir_id = _file_id(self.fd_dir)
        # (a listing counts the descriptor it reads through, too)
        self.fd_dir_sized = os.fstat(self.fd_dir).st_size == len(os.listdir("/proc/self/fd")) - 1
        # /dev/null for fds 0-2 after each job, held open: an open and a close less a job
        self.null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        self.null_id = _file_id(self.null)
        self.fds = self.open_files() or 0
        self.held = 0  # open files of a batch's later jobs, besides self.fds
        self.pid = os.getpid()
        # /tmp seen empty by one lstat instead of a listing (an open, two reads, a close)
        self.tmp_size = _empty_size("/tmp") if "/tmp" in EMPTIED else None
        self.not_tmp = [path for path in EMPTIED if path != "/tmp"]
        self.path = list(sys.path)
        self.handlers = [_signal.getsignal(s) for s in _WATCHED]
        self.script, self.code = "", _compiled("")
        self.own_cpu = 0.0  # the CPU this process had used as the last job ended (its own)
        self.kids_cpu = _cpu()[1]  # and its reaped children's then

    def run(self, request: dict[str, Any], out: int, err: int) -> tuple[dict[str, Any], bool]:
        """Run one job; how it ended, and whether its setup or its standard files say this
        process must be replaced after it (the rest of what it left: :meth:`left_behind`)."""
        # its reaped children's CPU is what the last job's end read: it waited for none since
        own = resource.getrusage(resource.RUSAGE_SELF)
        began = own.ru_utime + own.ru_stime + self.kids_cpu
        struct.pack_into("d", self.shared, 8, began)
        self.shared[0] = _IN_JOB
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)
        code, signum, spoiled = 127, 0, False
        try:
            self.set_limits(request["rlimits"])
            os.umask(0o077)
            os.chdir(request["cwd"])
            env = {str(k): str(v) for k, v in request["env"].items()}
            if request["kind"] == "python":
                code = self.python(request["script"], env)
            else:
                code, signum = self.spawn(request, env)
        except MemoryError:
            os.write(2, b"MemoryError\n")
            code, spoiled = 1, True
        except Exception as exc:  # noqa: BLE001 - a setup that failed ends this job alone
            with _quiet():
                os.write(2, f"cannot run the job: {exc!r}\n".encode())
            spoiled = True
        if os.getpid() != self.pid:
            # a process the job forked came back out of the script (an exception in it): it
            # must not go on as this job process, and answer the runner too
            os._exit(code & 0xFF)
        spoiled = not self.null_stdio() or spoiled  # the job's files are the runner's again
        self.end_leftovers()
        left = _left(self.empty())
        self.own_cpu, self.kids_cpu = _cpu()
        cpu = self.own_cpu + self.kids_cpu - began
        if signum:
            return {"exit_code": None, "signal": signum, "cpu_s": cpu} | left, spoiled
        return {"exit_code": code, "signal": 0, "cpu_s": cpu} | left, spoiled

    def set_limits(self, rlimits: list[list[Any]]) -> None:
        """The job's rlimits, set in this process when they differ from what it has (the first
        job; a job that changes one gets the next job a new process). RLIMIT_CPU counts this
        process's whole life, and the process is replaced once it used CPU_BUDGET_S: each job
        gets its cpu_s less at most that (a command job, its own process, all of it)."""
        for name, soft, hard in rlimits:
            if self.limits.get(name) != (soft, hard):
                _limit([[name, soft, hard]])
                self.limits[name] = resource.getrlimit(getattr(resource, name))

    def python(self, script: str, env: dict[str, str]) -> int:
        """The script in a fresh namespace of this process; what it changed of ``sys`` that the
        next job would meet is put back."""
        try:
            return _python(script, env, self.compiled)
        finally:
            # each stream once (a job's own sys.stdout is mostly the process's)
            for stream in {
                id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
            }.values():
                with _quiet_all():
                    stream.flush()  # type: ignore[union-attr]
            sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
            sys.path[:] = self.path

    def compiled(self, script: str) -> CodeType:
        """The last script's code, compiled once (~25 us for a two-line script, more for a
        longer one) while the same script comes again: the script is what the next job of the
        context may find anyway (docs/security/sandbox.md#warm-sandboxes)."""
        if script != self.script:
            self.code, self.script = _compiled(script), script
        return self.code

    def spawn(self, request: dict[str, Any], env: dict[str, str]) -> tuple[int, int]:
        """A command, by posix_spawn (no copy of this process); (exit code, signal)."""
        script_file = request.get("script_file") or ""
        if script_file:
            with open(os.open(script_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(request["script"])
        argv = [str(a) for a in request["argv"]]
        stdin = _stdin(request, script_file)
        try:
            pid = os.posix_spawnp(
                argv[0],
                argv,
                env,
                file_actions=[(os.POSIX_SPAWN_DUP2, stdin, 0)],
                setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        except OSError as exc:
            os.write(2, f"cannot start {argv[0]}: {exc}\n".encode())
            return 127, 0
        finally:
            os.close(stdin)
        _pid, status, _usage = os.wait4(pid, 0)
        with _quiet():
            os.killpg(pid, signal.SIGKILL)
        if script_file:
            with _quiet():
                os.unlink(script_file)
        if os.WIFSIGNALED(status):
            return 0, os.WTERMSIG(status)
        return os.WEXITSTATUS(status), 0

    def end_leftovers(self) -> None:
        """Kill what the job left running. Every process it started is a descendant of this
        one, a subreaper: none left when it has no child (one system call)."""
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        me = os.getpid()
        # its orphans (adopted) and its process group when there is no namespace to sweep
        end_leftovers((os.getppid(), me), self.outer_pidns, of=me)

    def threads_and_size(self) -> tuple[int, int] | None:
        """This process's threads and its mapped bytes, from one read of /proc/self/stat
        (num_threads and vsize, fields 20 and 23; the command name before them ends at the
        last ")"), or None if its held file is not that one any more."""
        try:
            if _file_id(self.stat) != self.stat_id:
                return None
            fields = os.pread(self.stat, 4096, 0).rsplit(b")", 1)[1].split()
            return int(fields[17]), int(fields[20])
        except (OSError, ValueError, IndexError):
            return None

    def open_files(self) -> int | None:
        """How many files this process has open; None if its held fd dir is not that one any
        more (a job put another file in its place)."""
        if not self.fd_dir_sized:
            return len(os.listdir("/proc/self/fd"))
        stat = os.fstat(self.fd_dir)
        if (stat.st_dev, stat.st_ino, stat.st_rdev) != self.fd_dir_id:
            return None
        return stat.st_size

    def null_stdio(self) -> bool:
        """/dev/null on fds 0-2 again; False if the job put another file in place of the one
        held for this (a fresh /dev/null is put there then, and the process is replaced)."""
        try:
            held = _file_id(self.null) == self.null_id
        except OSError:
            held = False
        if not held:
            _null_stdio()
            return False
        for fd in (0, 1, 2):
            os.dup2(self.null, fd)
        return True

    def empty(self) -> int:
        """Empty what a job may have left files in (EMPTIED); how many entries are left. /tmp
        is listed only when its size says it holds something."""
        if self.tmp_size is None:
            return empty_dirs(EMPTIED)
        try:
            tmp_empty = os.lstat("/tmp").st_size == self.tmp_size
        except OSError:
            tmp_empty = False
        return empty_dirs(self.not_tmp if tmp_empty else EMPTIED)

    def left_behind(self) -> bool:
        """Whether the last job left what the next must not meet (:meth:`spoiled`)."""
        return self.spoiled(self.own_cpu)

    def spoiled(self, own_cpu_s: float) -> bool:
        """Whether the job left what the next job must not meet: a thread, an open file, a
        changed limit, signal handler or timer, half its memory limit mapped, CPU_BUDGET_S
        used (``own_cpu_s`` is what it used), a standard stream closed."""
        read = self.threads_and_size()
        if read is None:  # its stat file closed, or another in its place: not as it was
            return True
        threads, mapped = read
        if threads != 1 or self.open_files() != self.fds + self.held:
            return True
        for name, value in self.limits.items():
            if resource.getrlimit(getattr(resource, name)) != value:
                return True
        if own_cpu_s > CPU_BUDGET_S:
            return True
        if [_signal.getsignal(s) for s in _WATCHED] != self.handlers:
            return True
        if any(signal.getitimer(t)[0] for t in _TIMERS):
            return True
        memory = self.limits.get("RLIMIT_AS", (0, 0))[0]
        if memory > 0 and mapped > memory // 2:
            return True
        return any(s is None or s.closed for s in (sys.__stdout__, sys.__stderr__))


class _quiet_all:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], Exception)  # type: ignore[arg-type]


def main() -> None:
    sock = _socket.socket(fileno=0)
    # a job of the same uid must not read this process's memory
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner ends this process with SIGKILL
    # compile()'s first call builds the ast module's ~120 classes (3 ms of CPU here): built
    # once, before any fork, not in every job's process
    compile("", "<warm>", "exec")
    gc.freeze()  # what the worker holds now is never collected: no job's process walks it
    SETTINGS.update(json.loads(sys.argv[3]))
    EMPTIED[:] = sys.argv[4:]
    send(sock, {"ready": True, "uid": os.getuid(), "pid": os.getpid()})
    if sys.argv[1:2] == ["--warm"]:
        serve_warm(sock, sys.argv[2] if len(sys.argv) > 2 else "")
        return
    while serve_one(sock):
        pass


if __name__ == "__main__":
    main()
