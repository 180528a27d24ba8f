"""The worker inside a sandbox: runs the jobs of one runner slot, one at a time, for as long as
the runner keeps it (node/sandbox/host.py). Standard library only, and nothing of the node is
imported: this process holds no secret and is started by exec of a fresh interpreter.

Protocol on fd 0 (a unix stream socket to the runner), frames of a 4-byte big-endian length
and JSON: the worker says ``{"ready": true}``; then per job the runner sends a request with two
open files attached (SCM_RIGHTS: the job's stdout and stderr) and the worker answers how the
job ended: ``{"exit_code": n | null, "signal": s, "cpu_s": t}``.

Each job runs in a fresh process of its own session: a python job in a fork of this warm
interpreter (its script in a fresh namespace), any other type by exec of its command. Before
the job's code runs, that process sets the job's rlimits, umask 077, its cwd (the work dir),
its environment, and closes every fd but 0/1/2. After the job, every process it left in the
sandbox (its pid namespace: a setsid daemon cannot leave it) is killed; under isolation
"none" only its process group is (there is no namespace to sweep).
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import socket
import struct
import sys
import tempfile
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


def _child(request: dict[str, Any], stdin: int, out: int, err: int) -> None:
    """In the job's new process: never returns."""
    code = 127
    try:
        os.setsid()
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


def run_job(request: dict[str, Any], out: int, err: int) -> dict[str, Any]:
    """Run one job and say how it ended."""
    script_file = request.get("script_file") or ""
    if script_file:
        with open(os.open(script_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(request["script"])
    feed = tempfile.TemporaryFile()
    if request["kind"] != "python" and not script_file:
        feed.write(request["script"].encode())
        feed.seek(0)
    try:
        pid = os.fork()
        if pid == 0:
            _child(request, feed.fileno(), out, err)
        _pid, status, usage = os.wait4(pid, 0)
    finally:
        feed.close()
        os.close(out)
        os.close(err)
    end_leftovers(pid, request.get("outer_pidns", ""))
    if script_file:
        with _quiet():
            os.unlink(script_file)
    cpu = usage.ru_utime + usage.ru_stime
    if os.WIFSIGNALED(status):
        return {"exit_code": None, "signal": os.WTERMSIG(status), "cpu_s": cpu}
    return {"exit_code": os.WEXITSTATUS(status), "signal": 0, "cpu_s": cpu}


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
    try:
        own = os.readlink("/proc/self/ns/pid")
    except OSError:
        return
    if not outer_pidns or own == outer_pidns:
        return
    me = os.getpid()
    if not _own_pid_namespace():
        # Outside a sandbox's pid namespace /proc lists the whole host: killing "every process
        # but pid 1" there would kill the machine. Only the sandbox's init may be bwrap.
        return
    for _ in range(100):
        left = [p for p in _live() if p not in (1, me)]
        if not left:
            return
        for pid in left:
            with _quiet():
                os.kill(pid, signal.SIGKILL)
        with _quiet():
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass


def _own_pid_namespace() -> bool:
    """True only inside bwrap's pid namespace, where pid 1 is bwrap's own init."""
    try:
        with open("/proc/1/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0", 1)[0]
    except OSError:
        return False
    return os.path.basename(argv0) == b"bwrap"


def _live() -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
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
    # a job of the same uid must not read this process's memory (the next job's request)
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner ends this process with SIGKILL
    # compile()'s first call builds the ast module's ~120 classes (3 ms of CPU here): built
    # once, before any fork, not in every job's process
    compile("", "<warm>", "exec")
    send(sock, {"ready": True, "uid": os.getuid(), "pid": os.getpid()})
    while True:
        try:
            request, fds = receive(sock)
        except (EOFError, ConnectionError, ValueError):
            return
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return
        send(sock, run_job(request, fds[0], fds[1]))


if __name__ == "__main__":
    main()
