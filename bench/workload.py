"""Job workloads: signed messages shaped exactly as the client writes them, and raw RESP loading.

The backlog cases need 100k queued messages quickly; going through ``Client.submit`` would
take minutes. Here the same writes (``HSET`` of ``Message.to_hash()``, ``LPUSH msg_out``: the
client writes only the message, which embeds its jobs; the node writes the job hashes) are
built once, encoded as RESP, and written to a fresh Valkey in big pipelined chunks.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass

from bus.core import keys
from bus.core.envelope import sign_message
from bus.core.ids import new_id, new_nonce, now
from bus.core.models import JobStatus, Message, MessageStatus, MessageType, RunnerJob
from crypto import KeyPair

SCRIPT = 'x = "41"\nprint(int(x) + 1)'


@dataclass(frozen=True)
class Prepared:
    job_key: str
    message_key: str
    resp: bytes  # HSET message, LPUSH msg_out (SUBMITTED_CMDS commands, as Client.submit writes)


SUBMITTED_CMDS = 2
MATERIALISED_CMDS = 4


def signed_job_message(
    actor: KeyPair, caller_id: int, context_id: int, origin: str, to: str, script: str = SCRIPT
) -> Message:
    job = RunnerJob(
        id=new_id(),
        caller_id=caller_id,
        context_id=context_id,
        script=script,
        script_type="python",
        timeout=60,
        created_at=now(),
        updated_at=now(),
    )
    return sign_message(
        Message(
            id=new_id(),
            caller_id=caller_id,
            context_id=context_id,
            message_type=MessageType.JOB,
            timeout=60,
            job=[job],
            created_at=now(),
            updated_at=now(),
            origin=origin,
            destination=to,
            nonce=new_nonce(),
        ),
        actor,
    )


def resp_command(*args: str) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for a in args:
        b = a.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


def hset_cmd(key: str, fields: dict[str, str]) -> bytes:
    return resp_command("HSET", key, *(x for kv in fields.items() for x in kv))


def submitted_form(message: Message) -> Prepared:
    """What ``Client.submit`` writes for a one-job message (its MULTI/EXEC without the wrapper;
    a group commit pushes several keys with one LPUSH, which stores the same list entries)."""
    [job] = message.job
    resp = hset_cmd(message.key, message.to_hash()) + resp_command(
        "LPUSH", keys.MSG_OUT, message.key
    )
    return Prepared(job.key, message.key, resp)


def materialised_form(message: Message) -> bytes:
    """What a node holds for a queued job after its consumer materialised it (local job).

    Job hash as the consumer writes it, the message hash as submitted and then acknowledged,
    the ``queue:python`` entry and the ``seen:`` replay marker, a field of the replay hash
    (materialise_many, ``node/intake/admission.py``).
    """
    [job] = message.job
    stamp = str(now())
    job_fields = job.to_hash() | {
        "status": JobStatus.DISPATCHED.value,
        "created_at": stamp,
        "updated_at": stamp,
        "message_key": message.key,
        "origin": message.origin,
        "admitted": "0" * 64,  # the admission stamp's size (bus/core/admitted.py)
    }
    msg_fields = message.to_hash() | {
        "status": MessageStatus.ACKNOWLEDGED.value,
        "updated_at": stamp,
    }
    return (
        hset_cmd(job.key, job_fields)
        + hset_cmd(message.key, msg_fields)
        + resp_command("LPUSH", keys.queue("python"), job.key)
        + resp_command(
            "HSETEX", keys.REPLAY, "EX", "420", "FIELDS", "1", keys.seen(message.key), "1"
        )
    )


def send_resp(port: int, db: int, chunks: Iterable[tuple[bytes, int]]) -> None:
    """Blocking: SELECT db, then send each (bytes, n_commands) chunk and read its n replies.

    Every reply of HSET/LPUSH/SET is one line; an error line raises RuntimeError.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        _roundtrip(s, resp_command("SELECT", str(db)), 1)
        for data, n in chunks:
            _roundtrip(s, data, n)


def _roundtrip(s: socket.socket, data: bytes, n: int) -> None:
    s.sendall(data)
    buf = b""
    lines = 0
    while lines < n:
        chunk = s.recv(1 << 20)
        if not chunk:
            raise RuntimeError("valkey closed the connection while loading")
        buf += chunk
        lines = buf.count(b"\r\n")
    if b"-" in buf and any(line.startswith(b"-") for line in buf.split(b"\r\n")):
        raise RuntimeError(f"valkey refused a load command: {buf[:200]!r}")


def chunked(items: list[bytes], per_item_cmds: int, size: int = 500) -> Iterable[tuple[bytes, int]]:
    for i in range(0, len(items), size):
        part = items[i : i + size]
        yield b"".join(part), len(part) * per_item_cmds
