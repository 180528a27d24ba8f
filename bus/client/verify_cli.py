"""``hero-verify``: crypto's offline tool, plus ``verify KEY --redis URL`` for stored messages.

The verdict on a stored message comes from :func:`bus.core.verify.judge`, the function the node's
supervisor and consumer use, so hero-verify and the node always agree.
"""

from __future__ import annotations

import argparse

import trio

from bus.core.ids import now
from bus.core.models import Message, MessageType
from bus.core.reasons import Reason
from bus.core.verify import Freshness, judge
from bus.errors import BusError, ModelError
from bus.store import records
from bus.store.connection import Store, open_store
from crypto import ALGORITHM_ED25519, Verdict
from crypto import cli as crypto_cli


def main(argv: list[str] | None = None) -> int:
    return crypto_cli.main(argv, redis_verifier=verify_stored)


def verify_stored(args: argparse.Namespace) -> Verdict:
    """Verdict on the message hash ``args.file`` in ``args.redis`` DB ``args.db``.

    Raises crypto_cli.InputError when the message cannot be read at all (exit code 2).
    """
    try:
        outcome = trio.run(_verify, args.redis, args.db, args.file, args.max_age)
    except BusError as exc:
        raise crypto_cli.InputError(str(exc)) from exc
    except BaseExceptionGroup as group:  # raised inside the store's nursery
        matched, rest = group.split(BusError)
        if rest is not None or matched is None:
            raise
        raise crypto_cli.InputError(str(matched.exceptions[0])) from group
    if isinstance(outcome, str):
        raise crypto_cli.InputError(outcome)
    return outcome


async def _verify(url: str, db: int, key: str, max_age: int | None) -> Verdict | str:
    """The verdict, or the reason the message cannot be judged at all."""
    async with open_store(url) as store:
        fields = await records.read_record(store, db, key)
        if not fields:
            return f"no message hash {key!r} in DB {db} of {url}"
        try:
            message = Message.from_hash(fields)
        except ModelError as exc:
            return Verdict(False, Reason.MALFORMED, detail=str(exc))
        signer, algorithm = await registered_signer(store, message)
        freshness = Freshness(max_age_s=max_age) if max_age is not None else None
        verdict = judge(
            message,
            signer,
            now=now() if freshness else None,
            freshness=freshness,
            algorithm=algorithm,
        )
        return Verdict(verdict.ok, verdict.reason, verdict.signer, verdict.detail)


async def registered_signer(store: Store, message: Message) -> tuple[str | None, str]:
    """The key that must have signed ``message`` and its algorithm: its actor's, or for a
    result its origin node's (always Ed25519)."""
    if message.message_type is MessageType.RESULT:
        own = await records.node_id(store)
        known = message.origin == own or await records.knows_peer(store, message.origin)
        return (message.origin if known else None), ALGORITHM_ED25519
    actor = await store.get_actor(message.caller_id)
    if actor is None:
        return None, ALGORITHM_ED25519
    return actor.pubkey, actor.algorithm


if __name__ == "__main__":
    raise SystemExit(main())
