"""The worker inside a sandbox: runs the jobs of one runner slot, one at a time, for as long as
the runner keeps it (node/sandbox/host.py). Standard library only, and nothing of the node is
imported: this process holds no secret and is started by exec of a fresh interpreter.

Protocol on fd 0 (a unix stream socket to the runner), frames of a 4-byte big-endian length
and JSON: the worker says ``{"ready": true}``; then per job the runner sends a request with two
open files attached (SCM_RIGHTS: the job's stdout and stderr) and the worker answers how the
job ended: ``{"exit_code": n | null, "signal": s, "cpu_s": t}``.

Each job runs in a fresh process of its own session, forked from this warm interpreter before
the job's request comes (off the job's way): that process, not this worker, reads the
request, so the worker never holds a job's script or environment, and no job's process holds
an earlier job's. A python job runs there (its script in a fresh namespace), any other type by
exec of its command. Before the job's code runs, that process sets the job's rlimits, umask
077, its cwd (the work dir), its environment, and closes every fd but 0/1/2. After the job,
every process it left in the sandbox (its pid namespace: a setsid daemon cannot leave it) is
killed; under isolation "none" only its process group is (there is no namespace to sweep).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import json
import os
import resource
import signal
import socket
import struct
import sys
import traceback
from typing import Any

_PR_SET_DUMPABLE = 4
_MAX_FRAME = 64 * 1024 * 1024


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request and the fds sent with it."""
    head, fds, _flags, _addr = socket.recv_fds(sock, 4, 4)
    if not head:
        raise EOFError
    head += _read_exact(sock, 4 - len(head))
    (size,) = struct.unpack(">I", head)
    if size > _MAX_FRAME:
        raise EOFError
    return json.loads(_read_exact(sock, size)), list(fds)


def send(sock: socket.socket, value: dict[str, Any]) -> None:
    data = json.dumps(value).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def _limit(rlimits: list[list[Any]]) -> None:
    for name, soft, hard in rlimits:
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (ValueError, OSError):  # above a hard limit set from outside: keep that one
            _, cur_hard = resource.getrlimit(getattr(resource, name))
            resource.setrlimit(getattr(resource, name), (min(soft, cur_hard), cur_hard))


def _python(script: str, env: dict[str, str]) -> int:
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["<job>"]
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(script, "<job>", "exec"), namespace)  # noqa: S102 - running jobs is the point
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
        traceback.print_exc()
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


def _next_job(sock: socket.socket, note: int) -> None:
    """The next job's process, forked before its request comes: it reads the request itself
    (the worker never holds a job's script or environment), tells the worker what it needs
    after the job, then becomes the job. Never returns."""
    try:
        os.setsid()
        request, fds = receive(sock)
        if len(fds) != 2:
            raise EOFError
        after = f"{request.get('script_file') or ''}\0{request.get('outer_pidns', '')}"
        os.write(note, after.encode())  # < PIPE_BUF: one write
        os.close(note)
    except (EOFError, ConnectionError, ValueError):  # the runner is gone, or spoke nonsense
        os._exit(0)
    _child(request, fds[0], fds[1])


def serve_one(sock: socket.socket) -> bool:
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
    end_leftovers(pid, outer_pidns)
    if script_file:
        with _quiet():
            os.unlink(script_file)
    cpu = usage.ru_utime + usage.ru_stime
    if os.WIFSIGNALED(status):
        send(sock, {"exit_code": None, "signal": os.WTERMSIG(status), "cpu_s": cpu})
    else:
        send(sock, {"exit_code": os.WEXITSTATUS(status), "signal": 0, "cpu_s": cpu})
    return True


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], OSError)  # type: ignore[arg-type]


def end_leftovers(job_pid: int, outer_pidns: str) -> None:
    """Kill what the job left running: its session always; and, only when this worker is in a
    pid namespace of its own (not the runner's, ``outer_pidns``), every process of the
    sandbox but its init (pid 1) and this worker, until none is left (bounded: a fork bomb
    must not keep the worker from answering). Without that check, isolation "none" would
    SIGKILL every process of the host that the worker's user may signal."""
    with _quiet():
        os.killpg(job_pid, signal.SIGKILL)  # setsid made it its session's and group's leader
    if not _sweeps(outer_pidns):
        return
    spared = (1, os.getpid())
    for _ in range(100):
        left = _live(spared)
        if not left:
            return
        for pid in left:
            with _quiet():
                os.kill(pid, signal.SIGKILL)
        with _quiet():
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


def _live(spared: tuple[int, ...]) -> list[int]:
    """The processes of the pid namespace, zombies and ``spared`` left out."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in spared:
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            out.append(int(name))
    return out


def main() -> None:
    sock = socket.socket(fileno=0)
    # a job of the same uid must not read this process's memory
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner ends this process with SIGKILL
    # compile()'s first call builds the ast module's ~120 classes (3 ms of CPU here): built
    # once, before any fork, not in every job's process
    compile("", "<warm>", "exec")
    gc.freeze()  # what the worker holds now is never collected: no job's process walks it
    send(sock, {"ready": True, "uid": os.getuid(), "pid": os.getpid()})
    while serve_one(sock):
        pass


if __name__ == "__main__":
    main()
