"""The models' codecs, per object: encode + decode N of each model, microseconds per call.

What a node, a runner and a client do per job with the data model, outside any I/O: a job
message's hash written (``Message.to_hash``) and parsed (``Message.from_hash``), its signed
content canonicalised, the job hash the node materialises and the runner reads back, the result
message and its body, the reply a client reads, a message's item of a link frame written and
read; and the registry objects (actor, context, flow, peer, runner), read per message from a
cache but measured all the same.

    python bench/codecs.py              # 100k of each
    python bench/codecs.py --n 20000 --profile message.from_hash

Figures taken while other work runs on the machine are indicative only.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bus.core.envelope import ResultBody, build_result, reply_text  # noqa: E402
from bus.core.frames import decode_frame, encode_msg_item, encode_msgs  # noqa: E402
from bus.core.models import (  # noqa: E402
    Actor,
    Context,
    Flow,
    FlowStatus,
    JobStatus,
    Message,
    MessageType,
    Peer,
    Runner,
    RunnerJob,
)
from crypto.signing import canonical_json  # noqa: E402

SCRIPT = 'x = "41"\nprint(int(x) + 1)'  # bench/workload.py's job
NODE_A, NODE_B = "a1" * 32, "b2" * 32
STAMP = 1_790_000_000_123


def _job() -> RunnerJob:
    return RunnerJob(
        id=4_411_222_333_444_555,
        caller_id=17,
        context_id=3,
        script=SCRIPT,
        script_type="python",
        created_at=STAMP,
        updated_at=STAMP,
        message_key="message:17:4411222333444556",
    )


def _message() -> Message:
    return Message(
        id=4_411_222_333_444_556,
        caller_id=17,
        context_id=3,
        message_type=MessageType.JOB,
        job=[_job()],
        created_at=STAMP,
        updated_at=STAMP,
        origin=NODE_A,
        destination=NODE_B,
        nonce="c3" * 16,
        reply_to="inbox:17:9",
        signatures=[{"algorithm": "ed25519", "public_key": NODE_A, "signature": "d4" * 64}],
    )


def cases() -> dict[str, Callable[[], object]]:
    """Each case's one call; a case named ``x.to_hash`` encodes, ``x.from_hash`` decodes."""
    job, msg = _job(), _message()
    body = ResultBody(msg.key, job.key, JobStatus.FINISHED, {"stdout": "42\n"})
    result = build_result(msg, body, origin=NODE_B)
    objects: dict[str, object] = {
        "job": job,
        "message": msg,
        "result": result,
        "actor": Actor(17, NODE_A, ["ws://10.0.0.1:7700"], STAMP, STAMP),
        "context": Context(3, [1], [17, 18], [17, 19, 20], STAMP, STAMP),
        "flow": Flow(5, 17, 3, [1, 2, 3], {"A": "1"}, {}, STAMP, STAMP, FlowStatus.STARTED),
        "peer": Peer(NODE_B, "ws://10.0.0.2:7700", "bob", STAMP, STAMP),
        "runner": Runner("python-1", NODE_A, "", "", True, "python", STAMP, STAMP),
    }
    out: dict[str, Callable[[], object]] = {}
    for name, obj in objects.items():
        cls = type(obj)
        h = obj.to_hash()  # type: ignore[attr-defined]
        out[f"{name}.to_hash"] = obj.to_hash  # type: ignore[attr-defined]
        out[f"{name}.from_hash"] = lambda cls=cls, h=h: cls.from_hash(h)  # type: ignore[misc]
    out["message.signed_bytes"] = lambda: canonical_json(msg.signed_content())
    out["result.signed_bytes"] = lambda: canonical_json(result.signed_content())
    text = body.encode()
    out["result_body.encode"] = body.encode
    out["result_body.decode"] = lambda: ResultBody.decode(text)
    out["reply_text"] = lambda: reply_text(msg.key, job.key, "finished", body.result, "")
    stored = msg.to_hash()
    item = encode_msg_item(msg.context_id, msg.key, stored)
    frame = encode_msgs([item]).encode()
    out["frame_item.encode"] = lambda: encode_msg_item(msg.context_id, msg.key, stored)
    out["msgs_frame.decode"] = lambda: decode_frame(frame)
    return out


def measure(call: Callable[[], object], n: int, rounds: int = 5) -> float:
    """CPU microseconds per call (this process's), the best of ``rounds`` rounds of ``n``
    calls: on a shared machine the least disturbed round is the closest to the code's cost."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(n):
            call()
        best = min(best, time.process_time() - start)
    return best / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="calls per round (5 rounds)")
    parser.add_argument("--only", default="", help="run the cases whose name contains this")
    parser.add_argument("--profile", default="", help="cProfile one case (its exact name)")
    args = parser.parse_args()
    table = cases()
    if args.profile:
        call = table[args.profile]
        profile = cProfile.Profile()
        profile.runcall(lambda: [call() for _ in range(args.n)])
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)
        return
    print(f"| case | CPU µs per call (best of 5 × {args.n:,}) |")
    print("|---|---|")
    total = 0.0
    for name, call in table.items():
        if args.only in name:
            us = measure(call, args.n)
            total += us
            print(f"| {name} | {us:.2f} |")
    print(f"| **sum** | **{total:.2f}** |")


if __name__ == "__main__":
    main()
