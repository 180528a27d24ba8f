"""A message of this node's own client that cannot even be parsed gets no result message (that
needs a parsed request), yet its client is answered at once, one error per job, with the reply
every other end writes (bus/core/envelope.py reply_text): a client reads the same bytes
whichever way its job ended (node/intake/messages.py)."""

from __future__ import annotations

import json

import trio

from bus.core import keys
from bus.core.envelope import reply_text
from bus.core.models import RunnerJob
from crypto import read_key_file


async def test_the_client_of_an_unparsable_message_reads_the_one_reply_form(node_factory):
    alice = await node_factory("alice")
    actor = read_key_file(alice.config.actor_key_path)
    jobs = [
        RunnerJob(n, 1, 1, "print(1)", "python", retries=1, retry_on=["sometimes"]) for n in (7, 8)
    ]
    msg = await alice.client.submit(actor, 1, to=alice.node_id, context_id=1, jobs=jobs)
    replies = []
    with trio.fail_after(20):  # the dead letter is written before the replies
        for _ in jobs:
            got = await alice.store.call(1, lambda r: r.blpop([keys.reply(msg.key)], timeout=20))
            replies.append(got[1])
    [letter] = [json.loads(e) for e in await alice.store.lrange(1, keys.DLQ)]
    why = f"{letter['reason']}: {letter['detail']}"
    assert sorted(replies) == sorted(reply_text(msg.key, j.key, "error", {}, why) for j in jobs)
