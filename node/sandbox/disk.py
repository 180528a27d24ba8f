"""A context's disk quota (``[limits] disk_mb``): its work dir is a file system of its own, an
ext4 image of that size loop-mounted on ``<home>/work/<context id>`` (strict mode, the node
root). A write past it fails in the job (ENOSPC) and nowhere else: no job of the context can
take more of the file system that holds the node's home, its Valkey and the other contexts'
dirs than its quota. The image is sparse (4.7 MiB on disk for 1024 MiB, made in ~25 ms here),
so quotas may add up to more than the disk holds: the node says so loudly when a context's
quota is mounted while the quotas together exceed the free space (the node's own free-space
headroom is what then keeps it writing).

The image is made and mounted by the first runner of the context that starts a sandbox (a lock
file keeps its slots from doing it twice), in the node's own mount namespace
(:func:`private_mounts`, made by ``hero-node run`` before anything else): the mount is seen by
the node, its runners and their sandboxes only, and goes, with its loop device, when the last of
them exits, however the node ended. Without that namespace there is no quota: a mount would
outlive the node in the host's namespace. The image, and the files in it, stay for the next run.
A larger ``disk_mb`` grows it (online) at the next mount check; a smaller one is refused
loudly (shrinking needs the file system offline).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from node.sandbox.limits import MB

log = logging.getLogger("node.sandbox.disk")

IMAGES = ".disks"  # under the work root: the images, one per context, 0700
# free bytes under which the work dir counts as full after a job that failed (ext4 made with
# no reserved blocks: a write that failed with ENOSPC leaves less than a block group free)
FULL_BYTES = 256 * 1024


_CLONE_NEWNS = 0x00020000
_MS_REC, _MS_SLAVE = 0x4000, 0x80000
OWN_NAMESPACE = False  # private_mounts() succeeded in this process


def private_mounts() -> bool:
    """Give this process (root, before it starts a thread) a mount namespace of its own, whose
    mounts never propagate to the host's (the host's still propagate in); whether it has one.
    Its children (runners, sandboxes) share it."""
    global OWN_NAMESPACE
    if os.geteuid() != 0:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        log.warning(
            "no mount namespace of its own (%s): no disk quota", os.strerror(ctypes.get_errno())
        )
        return False
    if libc.mount(None, b"/", None, _MS_REC | _MS_SLAVE, None) != 0:
        log.warning(
            "cannot make / a slave mount (%s): no disk quota", os.strerror(ctypes.get_errno())
        )
        return False
    OWN_NAMESPACE = True
    return True


class DiskError(OSError):
    """The work dir's file system cannot be made or mounted (the message says why)."""


@dataclass(frozen=True)
class DiskUse:
    used_bytes: int
    quota_bytes: int


# where the tools are found: a runner has no PATH of its own
_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/local/bin", "/usr/bin", "/bin")


def _tool(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), *_SBIN]))


def tools() -> str:
    """ "" if this host can make and mount images (mkfs.ext4, mount, resize2fs found), else
    what is missing."""
    missing = [t for t in ("mkfs.ext4", "mount", "resize2fs", "losetup") if not _tool(t)]
    return f"not found: {', '.join(missing)}" if missing else ""


def work_root_of(home: Path) -> Path:
    """Where each context's work dir is: ``<home>/work/<context id>``."""
    return home / "work"


def image_of(work_dir: Path) -> Path:
    return work_dir.parent / IMAGES / f"{work_dir.name}.img"


def _run(*argv: str) -> None:
    path = _tool(argv[0])
    if path is None:
        raise DiskError(f"{argv[0]}: not found")
    done = subprocess.run(  # noqa: S603 - the system's own tools, by absolute path
        [path, *argv[1:]], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise DiskError(f"{' '.join(argv[:2])}: {done.stderr.strip()[-300:]}")


def _make(image: Path, size: int, uid: int) -> None:
    tmp = image.with_suffix(".new")
    os.close(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600))
    os.truncate(tmp, size)
    # no blocks reserved for root (jobs never run as root); a journal of at most 4 MiB (mkfs
    # would give a 1 GiB image 32, and picks less than 4 itself below 64 MiB)
    journal = ["-J", "size=4"] if size >= 64 * MB else []
    owner = f"root_owner={uid}:{uid}"
    _run("mkfs.ext4", "-q", "-F", "-m", "0", *journal, "-E", owner, str(tmp))
    tmp.rename(image)


def _overcommitted(images: Path) -> None:
    """Warn when the contexts' quotas together exceed what their file system has free."""
    quotas = sum(p.stat().st_size for p in images.glob("*.img"))
    used = sum(p.stat().st_blocks * 512 for p in images.glob("*.img"))
    st = os.statvfs(images)
    if quotas - used > st.f_bavail * st.f_frsize:
        log.warning(
            "DISK OVERCOMMITTED: the contexts' quotas (%d MiB, %d MiB used) exceed the %d MiB "
            "free where their images are",
            quotas // MB,
            used // MB,
            st.f_bavail * st.f_frsize // MB,
        )


def _grow(image: Path, size: int, work_dir: Path) -> None:
    os.truncate(image, size)
    # the loop device sees the new size once told; resize2fs on the mount point grows online
    _run("losetup", "-c", _loop_of(work_dir))
    _run("resize2fs", _loop_of(work_dir))


def _loop_of(work_dir: Path) -> str:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if left.split()[4] == str(work_dir):
            return right.split()[1]
    raise DiskError(f"{work_dir} is not mounted")


def mount_quota(work_dir: Path, size_mb: int, uid: int) -> None:
    """``work_dir`` on an ext4 image of ``size_mb`` owned by ``uid``, made and mounted unless
    it is. Raises DiskError."""
    image = image_of(work_dir)
    image.parent.mkdir(mode=0o700, exist_ok=True)
    size = size_mb * MB
    with open(os.open(image.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the context's other slots wait: one mount
        mounted = os.path.ismount(work_dir)
        have = image.stat().st_size if image.exists() else 0
        if have and size < have:
            raise DiskError(
                f"disk_mb {size_mb} is below the {have // MB} MiB image of {work_dir}: "
                f"shrinking needs it offline (umount {work_dir}, then resize2fs {image})"
            )
        if mounted:
            if size > have:
                log.warning("growing the disk of %s to %d MiB", work_dir, size_mb)
                _grow(image, size, work_dir)
            return
        if not have:
            _make(image, size, uid)
        elif size > have:
            os.truncate(image, size)
            _run("resize2fs", "-f", str(image))
        if any(work_dir.iterdir()):
            log.warning("%s held files before its quota: they are hidden under the mount", work_dir)
        # an earlier run's namespace may still hold it (an orphaned runner finishing its
        # job): mount finds the image's loop device and reuses it, so both see one file
        # system, never two mounted from one image
        _run("mount", "-o", "loop,nosuid,nodev", str(image), str(work_dir))
        _overcommitted(image.parent)
        with contextlib.suppress(OSError):  # a job has no use for it, and cannot remove it
            (work_dir / "lost+found").rmdir()


def use(work_dir: Path) -> DiskUse | None:
    """The work dir's use and size, if it is a file system of its own (else None)."""
    if not os.path.ismount(work_dir):
        return None
    st = os.statvfs(work_dir)
    return DiskUse((st.f_blocks - st.f_bfree) * st.f_frsize, st.f_blocks * st.f_frsize)


def full(work_dir: str) -> bool:
    """Whether the work dir, a file system of its own, has (next to) no free space left."""
    try:
        st = os.statvfs(work_dir)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < FULL_BYTES


def unmount_all(work_root: Path) -> list[str]:
    """Unmount every context's work dir under ``work_root`` (the loop devices go with them);
    what was unmounted."""
    done = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if Path(point).parent == work_root:
            _run("umount", point)
            done.append(point)
    return done


def context_disks(
    work_root: Path, contexts: list[int], limits: dict[str, object], root: str = "/"
) -> dict[str, dict[str, object]]:
    """Each context's disk use against its quota, as ``status`` and /metrics show it.
    ``root``: where the node's mount namespace is seen from (``/proc/<node pid>/root`` for a
    process outside it). ``used_bytes`` is None where the work dir has no file system of its own
    (no quota in force: ``enforced`` False), or where it cannot be seen from here (``enforced``
    None: the node's mounts are root's to look at)."""
    from node.sandbox.limits import limits_for

    out: dict[str, dict[str, object]] = {}
    base = Path(root) / work_root.relative_to("/")
    for ctx in contexts:
        quota = limits_for(limits, ctx).disk_mb
        seen: bool | None = True
        try:
            os.stat(base / str(ctx))
            got = use(base / str(ctx))
        except PermissionError:  # the node's namespace is not this user's to look into
            got, seen = None, None
        except OSError:
            got = None
        out[str(ctx)] = {
            "quota_mb": quota,
            "used_bytes": got.used_bytes if got else None,
            "size_bytes": got.quota_bytes if got else None,
            "enforced": (got is not None and quota > 0) if seen else None,
        }
    return out
