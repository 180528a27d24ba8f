"""The node key's own process (the ssh-agent pattern): it signs result messages for the runner
processes, which never load or receive the key.

A runner process runs job code next to it (a python job in its very interpreter until the
sandbox moves it out); whatever such a process holds, a job may find. So the node starts one
small process first, hands it the key's seed over a pipe (never a file path, never the
environment) and keeps a control socket to it. For each runner process it starts, the node
makes a socket pair, passes one end to the signer over the control socket (SCM_RIGHTS) and the
other to the runner (an inherited fd): no path to connect to, so no other process can ask.

What the signer signs on a runner's socket: only a result message's signed content
(:meth:`bus.core.models.Message.signed_content`) whose ``message_type`` is ``result`` and whose
``origin`` is this node, under the result domain (bus/core/envelope.py). A runner can therefore
make the node vouch for a result (what it is trusted with), never for a job or flow-job message,
a stop, or a link's handshake transcript: those are other domains.

Protocol, one JSON object per line: a runner sends ``{"content": {...}}`` and reads
``{"signature": {algorithm, public_key, signature}}`` or ``{"error": "..."}``. The signer exits
once the node's control socket is closed (the node is gone) and no runner holds a socket any
more: a runner the node's death left running a job still gets its answer signed, as it did when
it held the key itself (docs/use/runners.md). Like the node and its runners it is not
dumpable (node/host/hardening.py).

The signer also tells the node, on a datagram socket of their own, which signature it made
for which result (its message key). The notice is sent before the runner has its answer, so it
waits in the socket before the result can be popped: the supervisor, the one reader, takes what
waits when it routes a result it has no signature for yet (:meth:`Signer.hear`), keeps it in
its one memory of the results signed here (:attr:`Signer.signed`, which its state holds), and
then does not verify that result again (:func:`node.intake.messages.signed_here`), as it does
not for the results it signs itself. A notice that cannot be sent at once (the socket holds
~160) is dropped (the node then verifies in full): a node that reads slowly never holds up a
runner's answer.

The node still holds the key itself for its own signatures (links' handshakes, flow jobs,
results it answers): moving those here too is future work (docs/security/
sandbox.md).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
from collections import OrderedDict
from dataclasses import replace
from typing import TYPE_CHECKING, NoReturn

import orjson

from bus.core import keys
from bus.core.envelope import DOMAIN_RESULT
from bus.core.models import Message, MessageType, dumps_json, loads_text
from bus.errors import ModelError
from crypto import KeyPair, sign_object
from node.errors import NodeError
from node.host.hardening import child_env, is_dumpable, not_dumpable

if TYPE_CHECKING:
    import trio

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 4 << 20  # a result's content: its output is capped far below this
_ATTACH = b"a"
SIGNED_MEMORY = 4096  # result signatures made here that the node keeps (the most recent)


class SignedResults:
    """The node's one memory of the result messages signed here, by message key: their
    signature entry, whether its signer made it for a runner (heard from its notices) or the
    node itself (node.intake.messages.result_message). The supervisor takes an entry once
    (node.intake.messages.signed_here). Bounded by :data:`SIGNED_MEMORY`, the oldest forgotten
    first: a result whose signature fell out is verified in full, as any other."""

    def __init__(self) -> None:
        self._by_key: OrderedDict[str, dict[str, str]] = OrderedDict()

    def keep(self, key: str, signature: dict[str, str]) -> None:
        self._by_key[key] = signature
        while len(self._by_key) > SIGNED_MEMORY:
            self._by_key.popitem(last=False)

    def take(self, key: str) -> dict[str, str] | None:
        """The signature kept for ``key``, forgotten then (None if none is)."""
        return self._by_key.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)


# -- the signer process -------------------------------------------------------------------------


def _check(content: object, node_id: str) -> str:
    """Why the signer refuses to sign ``content`` ("" if it signs it)."""
    if not isinstance(content, dict):
        return "content is not an object"
    if content.get("message_type") != MessageType.RESULT.value:
        return "only result messages are signed for runners"
    if content.get("origin") != node_id:
        return "a result must name this node as its origin"
    return ""


class _Runners:
    """How many runner sockets are open; the process ends when none is and the node is gone."""

    def __init__(self) -> None:
        self.open = 0
        self.node_gone = False
        self.lock = threading.Lock()

    def add(self) -> None:
        with self.lock:
            self.open += 1

    def done(self, *, node: bool = False) -> None:
        with self.lock:
            if node:
                self.node_gone = True
            else:
                self.open -= 1
            if self.node_gone and self.open == 0:
                os._exit(0)


def _serve_runner(
    conn: socket.socket, key: KeyPair, runners: _Runners, notices: socket.socket | None
) -> None:
    """Answer one runner's requests until it closes its end."""
    try:
        _answer_all(conn, key, notices)
    finally:
        runners.done()


def _answer_all(conn: socket.socket, key: KeyPair, notices: socket.socket | None) -> None:
    """A request is ``{"content": ...}`` (answered ``{"signature"}`` or ``{"error"}``) or, a
    batch's results, ``{"contents": [...]}`` (answered ``{"answers": [...]}``, one each, each
    checked alone)."""
    with conn, conn.makefile("rwb") as stream:
        for line in stream:
            try:
                request = loads_text(line[:MAX_REQUEST_BYTES].decode(), "request")
            except (ModelError, ValueError, TypeError):
                request = None
            if not isinstance(request, dict):
                request = {}
            contents = request.get("contents")
            if isinstance(contents, list) and 0 < len(contents) <= MAX_RESULTS:
                answer: dict[str, object] = {
                    "answers": [_answer(c, key, notices) for c in contents]
                }
            else:
                answer = _answer(request.get("content"), key, notices)
            stream.write(orjson.dumps(answer) + b"\n")
            stream.flush()


MAX_RESULTS = 64  # results signed in one request (a runner's batch)


def _answer(content: object, key: KeyPair, notices: socket.socket | None) -> dict[str, object]:
    why = _check(content, key.public_hex)
    if why:
        return {"error": why}
    try:
        signature = sign(key, content)
    except ValueError as exc:  # not canonicalisable
        return {"error": str(exc)}
    if notices is not None:
        _notify(notices, content, signature)  # type: ignore[arg-type]
    return {"signature": signature}


def _notify(notices: socket.socket, content: dict[str, object], signature: dict[str, str]) -> None:
    """Tell the node which signature this result got, before the runner has it (so before the
    result can be in msg_out); never waits, never fails the answer."""
    caller_id, ident = content.get("caller_id"), content.get("id")
    if type(caller_id) is not int or type(ident) is not int:
        return  # the node verifies such a result in full, and refuses it
    notice = {"key": keys.message(caller_id, ident), "signature": signature}
    with contextlib.suppress(OSError):  # full (a node that reads slowly), or the node is gone
        notices.send(orjson.dumps(notice), socket.MSG_DONTWAIT)


def sign(key: KeyPair, content: object) -> dict[str, str]:
    return sign_object(key, DOMAIN_RESULT, content)


def signer_main() -> None:
    """``python -m node.host.signer <control fd> [<notices fd>]``: the seed (4-byte length,
    bytes) on stdin."""
    not_dumpable()
    control = socket.socket(fileno=int(sys.argv[1]))
    notices = socket.socket(fileno=int(sys.argv[2])) if len(sys.argv) > 2 else None
    stdin = sys.stdin.buffer
    head = stdin.read(4)
    seed = stdin.read(struct.unpack(">I", head)[0]) if len(head) == 4 else b""
    stdin.close()
    if len(seed) != 32:  # the node stopped before it handed over the key: nothing to sign with
        os._exit(0)
    key = KeyPair.from_seed(seed)
    control.sendall(b"up1" if is_dumpable() else b"up0")  # the node publishes the flag
    runners = _Runners()
    while True:
        data, fds, _flags, _addr = socket.recv_fds(control, 16, 4)
        if not data:  # the node is gone: serve the runners it left until they end too
            runners.done(node=True)
            threading.Event().wait()
        for fd in fds:
            conn = socket.socket(fileno=fd)
            runners.add()
            args = (conn, key, runners, notices)
            threading.Thread(target=_serve_runner, args=args, daemon=True).start()


# -- a runner's side ------------------------------------------------------------------------------


class SignerGone(NodeError):
    """The signer's socket closed: no answer of this runner can be signed any more."""


class SignerClient:
    """A runner process's end of its socket to the signer."""

    def __init__(self, fd: int) -> None:
        self.conn = socket.socket(fileno=fd)
        self.stream = self.conn.makefile("rwb")
        self.lock = threading.Lock()

    def sign_result(self, message: Message) -> Message:
        """``message`` signed by the node's key; NodeError if the signer refuses, SignerGone if
        it is gone."""
        return self.sign_results([message])[0]

    def sign_results(self, messages: list[Message]) -> list[Message]:
        """``messages`` signed by the node's key, in one request (one line each way: a lone
        one as ``content``, several as ``contents``); NodeError if the signer refuses any,
        SignerGone if it is gone."""
        if len(messages) == 1:
            body: dict[str, object] = {"content": messages[0].signed_content()}
        else:
            body = {"contents": [m.signed_content() for m in messages]}
        with self.lock:
            try:
                self.stream.write(dumps_json(body) + b"\n")
                self.stream.flush()
                line = self.stream.readline()
            except OSError:
                line = b""
        if not line:
            raise SignerGone("the node's signer is gone")
        answer = loads_text(line.decode(), "the signer's answer")
        answers = answer.get("answers", [answer]) if len(messages) > 1 else [answer]
        if not isinstance(answers, list) or len(answers) != len(messages):
            raise NodeError(f"the node's signer refused: {answer.get('error')}")
        signed = []
        for message, each in zip(messages, answers, strict=True):
            if not isinstance(each, dict) or "signature" not in each:
                why = each.get("error") if isinstance(each, dict) else each
                raise NodeError(f"the node's signer refused: {why}")
            signed.append(replace(message, signatures=[each["signature"]]))
        return signed


# -- the node's side ------------------------------------------------------------------------------


class Signer:
    """The node's handle on its running signer process."""

    def __init__(
        self,
        control: trio.socket.SocketType,
        pid: int,
        dumpable: bool,
        notices: socket.socket | None = None,
    ) -> None:
        self.control = control
        self.pid = pid
        self.dumpable = dumpable  # its memory open to processes of its uid (prctl failed)
        # the signatures the signer made for runners, by message key (its notices): the node's
        # memory of the results signed here (NodeState.recent.signed_results)
        self.signed = SignedResults()
        self.notices = notices  # where they come

    def hear(self) -> None:
        """Take the notices that wait in the socket into :attr:`signed`. Called by the one
        reader, when a result needs them: a task of its own would race the supervisor for
        them (trio wakes tasks in no fixed order), and a notice always waits before its
        result can be popped."""
        while self.notices is not None:
            try:
                self.took_notice(self.notices.recv(65536, socket.MSG_DONTWAIT))
            except OSError:  # none waiting (BlockingIOError), or the signer is gone
                return

    def took_notice(self, data: bytes) -> None:
        """Remember one notice of the signer (``{"key", "signature"}``); anything else is
        ignored: the result it would vouch for is then verified in full."""
        try:
            notice = loads_text(data.decode(), "notice")
            key, signature = notice["key"], notice["signature"]
        except (ModelError, ValueError, TypeError, KeyError):
            return
        if not isinstance(key, str) or not isinstance(signature, dict):
            return
        self.signed.keep(key, signature)

    async def attach(self) -> socket.socket:
        """A new socket to the signer, for one runner process (pass its fd to the process,
        then close it here)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            fds = struct.pack("i", theirs.fileno())
            await self.control.sendmsg([_ATTACH], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        finally:
            theirs.close()
        return mine


async def run_signer(key: KeyPair, *, task_status: trio.TaskStatus[Signer]) -> NoReturn:
    """Run the signer process with ``key`` until cancelled; reports a :class:`Signer` once it
    is up. Raises NodeError if it exits (runners could not answer remote requests any more:
    the node stops rather than pile up unsigned results)."""
    # imported here: the signer process and the runner processes (SignerClient) import this
    # module and never run trio, whose import costs each of them ~0.1 s of CPU at start
    import trio

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # datagrams: a notice arrives whole or not at all, and a full socket drops it
    heard, told = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with ours, theirs, heard, told:
        fds = (theirs.fileno(), told.fileno())
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "node.host.signer", *map(str, fds)],
            stdin=subprocess.PIPE,
            pass_fds=fds,
            start_new_session=True,
            env=child_env(),
        )
        theirs.close()
        told.close()
        control = trio.socket.from_stdlib_socket(ours)
        try:
            assert proc.stdin is not None
            seed = key.seed
            await proc.stdin.send_all(struct.pack(">I", len(seed)) + seed)
            await proc.stdin.aclose()
            up = await control.recv(3)
            if up not in (b"up0", b"up1"):
                raise NodeError(f"the signer process exited at start (code {await proc.wait()})")
            log.info("signer up, pid %d", proc.pid)
            signer = Signer(control, proc.pid, dumpable=up == b"up1", notices=heard)
            task_status.started(signer)
            code = await proc.wait()
            raise NodeError(f"the signer process exited (code {code})")
        finally:
            with trio.CancelScope(shield=True):
                control.close()
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()


if __name__ == "__main__":
    signer_main()
