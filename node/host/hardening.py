"""What keeps the node's secrets its own on a shared machine: the home's modes, the admission
key, and processes whose memory and environment other processes of the same user cannot read.

- The home is 0700, ``secrets/`` 0700, and every secret file (keys, passwords, the admission key)
  0600, checked at each start: a mode that is too open is fixed with a warning (a home copied
  with ``cp -r`` or unpacked by a tool that ignores modes); a secret owned by another user is
  refused (whoever owns it may have read or replaced it).
- ``secrets/admission.key`` (32 random bytes, hex): the key of the admission stamp
  (bus/core/admitted.py), made by ``hero-node init`` or at the first start of an older home. The
  node and its runner processes hold it (passed over the runner's pipe); no one else needs it.
- :func:`not_dumpable`: ``prctl(PR_SET_DUMPABLE, 0)``. A process of the same uid can otherwise
  read ``/proc/<pid>/environ`` and ``/proc/<pid>/mem`` (the node key's seed is in the node's
  memory) or ptrace it; a non-dumpable process is open to those only with CAP_SYS_PTRACE. The
  node, its signer (node/host/signer.py) and every runner process call it first thing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import stat
from pathlib import Path

from bus.core.admitted import KEY_BYTES
from node.errors import NodeError

log = logging.getLogger(__name__)

ADMISSION_KEY = "admission.key"
SECRET_ENV = ("HERO_KEY_PASSPHRASE",)  # of the node's environment, never passed to a child
_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


def admission_key_path(home: Path) -> Path:
    return home / "secrets" / ADMISSION_KEY


def ensure_admission_key(home: Path) -> bytes:
    """The admission key of ``home``, made (0600, in a 0700 ``secrets/``) if it has none.
    NodeError if it cannot be read or is not 32 bytes of hex."""
    path = admission_key_path(home)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        write_private(path, secrets.token_hex(KEY_BYTES) + "\n")
        log.info("generated the admission key %s", path)
    try:
        key = bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError) as exc:
        raise NodeError(
            f"cannot read the admission key {path} ({exc}); delete it to make a new one"
        ) from None
    if len(key) != KEY_BYTES:
        raise NodeError(f"{path} does not hold {KEY_BYTES} bytes; delete it to make a new one")
    return key


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the first byte (then rename into place)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def check_home(home: Path, secret_files: list[Path]) -> list[str]:
    """Make the home 0700, ``secrets/`` 0700 and each existing file of ``secret_files`` (and of
    ``secrets/``) 0600; returns what was fixed (each also logged as a warning). NodeError if one
    of them is owned by another user than this process's."""
    fixed: list[str] = []
    folder = home / "secrets"
    for path, mode in [(home, 0o700), (folder, 0o700)]:
        if path.is_dir():
            _tighten(path, mode, fixed)
    files = list(secret_files)
    if folder.is_dir():
        files += [p for p in folder.iterdir() if p.is_file() and p not in files]
    for path in files:
        if path.is_file():
            _tighten(path, 0o600, fixed)
    return fixed


def _tighten(path: Path, mode: int, fixed: list[str]) -> None:
    info = path.stat()
    if info.st_uid != os.geteuid():
        raise NodeError(
            f"{path} is owned by uid {info.st_uid}, not by this node's uid {os.geteuid()}: "
            "it may have been read or replaced; check it and chown it to the node's user"
        )
    now = stat.S_IMODE(info.st_mode)
    if now & ~mode:
        path.chmod(now & mode)
        what = f"{path} was mode {now:04o}; made {now & mode:04o}"
        log.warning("%s (secrets must be readable by the node's user only)", what)
        fixed.append(what)


def child_env() -> dict[str, str]:
    """The node's environment less what is secret in it (what a process it starts gets)."""
    return {k: v for k, v in os.environ.items() if k not in SECRET_ENV}


def not_dumpable() -> bool:
    """Keep other processes of this uid out of this process's memory and environment
    (``prctl(PR_SET_DUMPABLE, 0)``); False where prctl is unavailable (not Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def is_dumpable() -> bool:
    """This process's dumpable flag (True where it cannot be read)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) != 0)
    except (OSError, AttributeError):
        return True
