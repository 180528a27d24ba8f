"""The probes of the adversarial suite (tests/sandbox/test_isolation.py): jobs an executor of
context A submits, each trying one thing that isolation must forbid, and each with its own check.

A probe's script reads what it needs from its environment (job ``env_vars``, set by the test
from what an attacker could learn anyway: the home's path, the node's pid and public key, the
ports, context B's work directory). It prints what it found: a probe cannot know a secret's
value, so it prints whatever it reads or finds, and the test, from outside, looks for the real
values (read from the home) in everything a job could leave: outputs, Valkey, logs. Binary
finds (key bytes in memory) are printed as hex.

The words a probe prints when it succeeded (``AUTH-OK``, ``PTRACE-ATTACHED``...) are computed at
run time or made of parts, so that a script's text, stored in Valkey with its job, never
contains them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# -- what the checks see --------------------------------------------------------------------


@dataclass(frozen=True)
class Seen:
    """How a probe's job ended, as its client was told (None fields: no result came)."""

    status: str
    reason: str
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return "\n".join((self.status, self.reason, self.stdout, self.stderr))


Check = Callable[[Seen], str | None]  # a violation in the probe's own words, or None


def absent(word: str, what: str) -> Check:
    """A violation if the probe printed ``word`` (it says it did what it must not)."""

    def check(seen: Seen) -> str | None:
        return f"{what} ({word!r} in its output)" if word in seen.text else None

    return check


def limited(token: str, what: str) -> Check:
    """A violation unless the job ended ``error`` with ``token`` in its reason."""

    def check(seen: Seen) -> str | None:
        if seen.status == "error" and token in seen.reason:
            return None
        return f"{what}: ended {seen.status!r} ({seen.reason[:120]!r}), not with {token!r}"

    return check


@dataclass(frozen=True)
class Probe:
    name: str
    script_type: str  # "sh" or "python"
    script: str
    checks: tuple[Check, ...] = ()
    # 1: with the others; 2: after them (it may kill what the others need, the node first)
    phase: int = 1
    # it only reads and connects: safe to run with no isolation (the negative control). The
    # others signal, fork, fill memory, CPU or disk: never run outside a sandbox
    harmless: bool = False
    timeout_s: int = 30
    env: dict[str, str] = field(default_factory=dict)


# -- the scripts ----------------------------------------------------------------------------

READ_HOME_SH = """\
cd "$HOME_DIR" 2>&1 && ls -la . secrets run 2>&1
cat "$HOME_DIR/node.key" "$HOME_DIR/actor.key" "$HOME_DIR"/secrets/* 2>&1
cat "$HOME_DIR/config.toml" 2>&1 | head -c 4000
"""

READ_HOME_PY = """\
import glob, os
home = os.environ["HOME_DIR"]
for path in ["node.key", "actor.key", *glob.glob(home + "/secrets/*")]:
    try:
        with open(os.path.join(home, path), "rb") as f:
            data = f.read(4096)
        print(path, data.decode("latin-1"), data.hex())
    except OSError as exc:
        print(path, exc)
"""

OTHER_CONTEXT_SH = """\
ls -la "$B_DIR" 2>&1
cat "$B_DIR"/* 2>&1 | head -c 4000
cat "$HOME_DIR"/run/logs/2-* 2>&1 | head -c 4000
cat "$HOME_DIR"/work/2/* 2>&1 | head -c 4000
"""

# Finds the node's key in a process's memory: the public key (which every peer knows) sits
# right after the 32-byte seed in libsodium's 64-byte secret key; what precedes each copy of it
# is printed as hex. Also prints the process's environment (Valkey URLs with passwords).
MEMORY_PY = """\
import os, re
pub = bytes.fromhex(os.environ["NODE_PUB"])
def scan(pid, budget=1 << 30):
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            print("ENV", pid, f.read().decode("latin-1"))
    except OSError as exc:
        print("environ", pid, exc)
    try:
        maps = open("/proc/%s/maps" % pid).read().splitlines()
        mem = open("/proc/%s/mem" % pid, "rb", buffering=0)
    except OSError as exc:
        print("mem", pid, exc)
        return
    with mem:
        for line in maps:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if "r" not in perms or hi - lo > budget or "[vvar]" in line:
                continue
            budget -= hi - lo
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except (OSError, OverflowError, ValueError):
                continue
            at = data.find(pub)
            while at >= 32:
                print("CANDIDATE", pid, data[at - 32:at].hex())
                at = data.find(pub, at + 1)
for pid in [os.environ["NODE_PID"], *os.environ["OTHER_PIDS"].split(), "self", str(os.getppid())]:
    scan(pid)
"""

INTERPRETER_PY = """\
import gc, os
for obj in gc.get_objects():
    name = type(obj).__name__
    if name in ("KeyPair", "SigningKey", "PrivateKey", "Secp256k1KeyPair"):
        for attr in ("seed", "_seed", "_signing_key", "_private_key", "key"):
            value = getattr(obj, attr, None)
            if isinstance(value, bytes):
                print("KEYOBJ", name, attr, value.hex())
        try:
            print("KEYOBJ", name, bytes(obj).hex())
        except Exception:
            pass
    elif isinstance(obj, dict) and "node_key" in obj:
        print("SPEC", {k: str(v)[:300] for k, v in obj.items()})
print("ENVIRON", dict(os.environ))
for pid in ("self", str(os.getppid())):
    try:
        with open("/proc/%s/environ" % pid, "rb") as f:
            print("PROCENV", pid, f.read().decode("latin-1"))
    except OSError as exc:
        print("procenv", pid, exc)
"""

# A tiny Valkey client, and every password the job can lay hands on.
RESP_PY = """\
import glob, json, os, re, socket
def read(f):
    line = f.readline()
    if not line:
        raise OSError("closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b"*":
        n = int(rest)
        return None if n < 0 else [read(f) for _ in range(n)]
    return rest
class Conn:
    def __init__(self, where):
        if isinstance(where, str):
            self.s = socket.socket(socket.AF_UNIX)
            self.s.settimeout(3)
            self.s.connect(where)
        else:
            self.s = socket.create_connection(where, 3)
        self.f = self.s.makefile("rb")
    def __call__(self, *args):
        args = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        parts = [b"$%d\\r\\n%s\\r\\n" % (len(a), a) for a in args]
        self.s.sendall(b"*%d\\r\\n" % len(args) + b"".join(parts))
        return read(self.f)
def loot():
    words, users = set(), {"default", "node", "runner", "admin", "client", "external"}
    home = os.environ["HOME_DIR"]
    for path in glob.glob(home + "/secrets/*"):
        users.add(os.path.basename(path).replace("valkey-", ""))
        try:
            words.add(open(path).read().strip())
        except OSError:
            pass
    texts = [json.dumps(dict(os.environ))]
    pids = ["self", str(os.getppid()), os.environ["NODE_PID"], *os.environ["OTHER_PIDS"].split()]
    for pid in pids:
        for part in ("environ", "cmdline"):
            try:
                texts.append(open("/proc/%s/%s" % (pid, part), "rb").read().decode("latin-1"))
            except OSError:
                pass
    for text in texts:
        urls = r"(?:redis|rediss|unix|valkey)://([^:@/\\s\\x00]*):([^@/\\s\\x00]+)@"
        for user, word in re.findall(urls, text):
            users.add(user or "default")
            words.add(word)
    return sorted(users), sorted(w for w in words if w)
def logged_in():
    ok = "AUTH" + "-OK"
    for where in (os.environ["VALKEY_SOCK"], ("127.0.0.1", int(os.environ["VALKEY_PORT"]))):
        try:
            c = Conn(where)
        except OSError as exc:
            print("connect", where, exc)
            continue
        print("VALKEY" + "-REACHED", where, c("PING"))
        users, words = loot()
        for user in users:
            for word in words:
                if c("AUTH", user, word) == b"OK":
                    print(ok, where, user, word)
                    yield c
"""

VALKEY_PY = (
    RESP_PY
    + """\
for c in logged_in():
    print("hset", c("SELECT", 0), c("HSET", "actor:666", "pubkey", os.environ["NODE_PUB"]))
    for db in (0, 1, 2):
        c("SELECT", db)
        for key in c("KEYS", "*") or []:
            kind = c("TYPE", key)
            how = {b"hash": ("HGETALL",), b"list": ("LRANGE", 0, 20), b"string": ("GET",)}
            value = c(how[kind][0], key, *how[kind][1:]) if kind in how else kind
            print("DUMP", db, key, str(value)[:2000])
"""
)

FOREIGN_PY = (
    RESP_PY
    + """\
for c in logged_in():
    job = json.loads(os.environ["FOREIGN_HASH"])
    key = os.environ["FOREIGN_KEY"]
    print("write", c("SELECT", 2), c("HSET", key, *[x for kv in job.items() for x in kv]))
    print("queue", c("LPUSH", "queue:sh", key))
"""
)

# What the foreign job does if it runs: a file the test looks for, and a word computed at run
# time (N + 1) that appears in its text nowhere.
FOREIGN_JOB_SH = """\
echo "ran-$((FOREIGN_N + 1))" > "$FOREIGN_OUT"
echo "ran-$((FOREIGN_N + 1))"
"""

PORTS_PY = """\
import os, socket
for name in ("WS_PORT", "CONSOLE_PORT", "VALKEY_PORT"):
    port = int(os.environ[name])
    try:
        with socket.create_connection(("127.0.0.1", port), 2) as s:
            s.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\nUpgrade: websocket\\r\\n\\r\\n")
            print("CONNECT" + "ED", name, port)
    except OSError as exc:
        print(name, port, exc)
"""

PTRACE_PY = """\
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
for pid in [os.environ["NODE_PID"], *os.environ["OTHER_PIDS"].split()]:
    if libc.ptrace(16, int(pid), None, None) == 0:  # PTRACE_ATTACH
        print("PTRACE" + "-ATTACHED", pid)
        try:
            os.waitpid(int(pid), 0x40000000)  # __WALL
        except OSError:
            pass
        libc.ptrace(17, int(pid), None, None)  # PTRACE_DETACH
    else:
        print("ptrace", pid, os.strerror(ctypes.get_errno()))
"""

UNSHARE_SH = """\
unshare -U sh -c 'echo "UNSHARE""-OK $(id -u)"' 2>&1
unshare -Ur sh -c 'echo "UNSHARE""-ROOT $(id -u)"' 2>&1
"""

SETUID_PY = """\
import os
try:
    os.setuid(0)
    print("SETUID" + "-OK", os.getuid(), os.geteuid())
except OSError as exc:
    print("setuid", exc)
try:
    print("SHADOW", open("/etc/shadow").read())
except OSError as exc:
    print("shadow", exc)
"""

# Daemons that try to outlive the job: a new session, a double fork. Their argv carries the
# probe's mark, so the test finds them in /proc whatever their environment.
DAEMONS_SH = """\
setsid sh -c 'sleep 3000; :' "daemon-$PROBE_MARK" < /dev/null > /dev/null 2>&1 &
( sh -c 'sleep 3001; :' "dfork-$PROBE_MARK" < /dev/null > /dev/null 2>&1 & ) &
nohup sh -c 'sleep 3002; :' "nohup-$PROBE_MARK" < /dev/null > /dev/null 2>&1 &
echo left
"""

FORK_SH = """\
i=0
while [ $i -lt 500 ]; do
    sleep 5 &
    i=$((i + 1))
done
wait
echo "forked $i"
"""

MEMORY_2G_PY = """\
b = bytearray(2 << 30)
for i in range(0, len(b), 4096):
    b[i] = 1
print("allocated", len(b))
"""

CPU_PY = """\
while True:
    pass
"""

FILES_PY = """\
files = [open("/dev/null") for _ in range(10000)]
print("opened", len(files))
"""

# The job ends as dd did: a limit that fired must show in the job's end, not be swallowed by
# the ls after it.
DISK_SH = """\
dd if=/dev/zero of=big bs=1M count=1024 2>&1
status=$?
ls -la big 2>&1
exit $status
"""

# kill -9 -1 reaches every process this uid may signal. Outside a pid namespace of its own that
# is the node, the test and the machine: the probe then only says so (a violation) and does not
# do it.
KILL_ALL_SH = """\
if [ "$(readlink /proc/self/ns/pid)" = "$HOST_PIDNS" ]; then
    echo "UNSAFE""-KILL-ALL: this job shares the node's pid namespace"
else
    kill -9 -1
fi
"""

SIGNAL_NODE_SH = """\
for pid in $NODE_PID $OTHER_PIDS; do kill -STOP "$pid" 2>&1; done
kill -TERM "$NODE_PID" 2>&1
for pid in $NODE_PID $OTHER_PIDS; do kill -KILL "$pid" 2>&1; done
echo signalled
"""


def probes() -> list[Probe]:
    """Every probe, with its own checks (the secrets, processes and Valkey are checked for all
    of them by the test)."""
    return [
        Probe("read_home_sh", "sh", READ_HOME_SH, harmless=True),
        Probe("read_home_py", "python", READ_HOME_PY, harmless=True),
        Probe("other_context", "sh", OTHER_CONTEXT_SH, harmless=True),
        Probe("proc_memory", "python", MEMORY_PY, timeout_s=60, harmless=True),
        Probe("own_interpreter", "python", INTERPRETER_PY, harmless=True),
        Probe(
            "valkey_auth",
            "python",
            VALKEY_PY,
            (
                absent("VALKEY-REACHED", "reached the node's Valkey"),
                absent("AUTH-OK", "logged in to the node's Valkey"),
            ),
            harmless=True,
        ),
        Probe(
            "foreign_job",
            "python",
            FOREIGN_PY,
            (absent("AUTH-OK", "logged in to Valkey"),),
            harmless=True,
        ),
        Probe(
            "ports",
            "python",
            PORTS_PY,
            (absent("CONNECTED", "reached a node port"),),
            harmless=True,
        ),
        Probe(
            "unshare_user",
            "sh",
            UNSHARE_SH,
            (absent("UNSHARE-OK", "made a user namespace"), absent("UNSHARE-ROOT", "became root")),
            harmless=True,
        ),
        Probe(
            "setuid_shadow",
            "python",
            SETUID_PY,
            (absent("SETUID-OK", "became uid 0"),),
            harmless=True,
        ),
        # from here on: never without a sandbox (they stop, kill, fork, fill)
        Probe("ptrace", "python", PTRACE_PY, (absent("PTRACE-ATTACHED", "ptraced the node"),)),
        Probe("daemons", "sh", DAEMONS_SH),
        Probe("fork_500", "sh", FORK_SH, (limited("pids_limit", "500 processes"),)),
        Probe("memory_2g", "python", MEMORY_2G_PY, (limited("memory_limit", "2 GiB touched"),)),
        Probe("cpu_spin", "python", CPU_PY, (limited("cpu_limit", "a CPU spin"),), timeout_s=10),
        Probe(
            "files_10k",
            "python",
            FILES_PY,
            (absent("opened 10000", "10,000 files open at once"),),
        ),
        Probe("disk_1g", "sh", DISK_SH, (limited("file_size_limit", "1 GiB written"),)),
        Probe(
            "kill_all",
            "sh",
            KILL_ALL_SH,
            (absent("UNSAFE-KILL-ALL", "kill -9 -1 would reach the node"),),
            phase=2,
        ),
        Probe("signal_node", "sh", SIGNAL_NODE_SH, phase=2),
    ]
