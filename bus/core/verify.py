"""The one verdict on a message, shared by the node and ``hero-verify``. Pure, no I/O.

The caller looks up the signer's registered key (``actor:<caller_id>`` for a job message, the
origin node for a result) and the context, and passes them in; this module decides. Reasons are
short tokens recorded in the dead-letter list: ``bad_signature``, ``unknown_signer``,
``wrong_signer``, ``malformed``, ``expired``, ``from_future``, for the key algorithms
``wrong_algorithm``, ``malformed_key``, ``uncompressed_key``, ``invalid_point``, ``high_s``,
and for the caller's permission ``unknown_context``, ``permission_denied``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import msgspec

from bus.core.envelope import verify_message
from bus.core.models import Context, Message
from bus.core.reasons import Reason
from crypto import ALGORITHM_ED25519

DEFAULT_MAX_AGE_S = 300
DEFAULT_MAX_SKEW_S = 60


@dataclass(frozen=True)
class Freshness:
    max_age_s: int = DEFAULT_MAX_AGE_S
    max_skew_s: int = DEFAULT_MAX_SKEW_S

    @property
    def window_s(self) -> int:
        """How long a seen key/nonce must be remembered so a replay is always caught."""
        return self.max_age_s + self.max_skew_s + 60


@dataclass(frozen=True)
class AcceptedAlgorithms:
    """The actor key algorithms each context accepts: its own entry, else the default (a
    node's ``[algorithms]``, resolved once by :attr:`NodeConfig.accepted_algorithms`)."""

    default: tuple[str, ...]
    own: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def accepted(self, ctx: int) -> tuple[str, ...]:
        return self.own.get(ctx, self.default)


class MessageVerdict(msgspec.Struct, frozen=True):
    ok: bool
    reason: str = "ok"
    detail: str = ""
    signer: str | None = None


def freshness_problem(message: Message, now: int, freshness: Freshness) -> MessageVerdict | None:
    """A failing verdict if ``message`` is too old or dated too far ahead, else None."""
    age = now - message.created_at
    if age > freshness.max_age_s:
        return MessageVerdict(
            False, Reason.EXPIRED, f"created {age} s ago; the limit is {freshness.max_age_s} s"
        )
    if -age > freshness.max_skew_s:
        return MessageVerdict(
            False,
            Reason.FROM_FUTURE,
            f"dated {-age} s ahead; the limit is {freshness.max_skew_s} s",
        )
    return None


def judge(
    message: Message,
    registered_key: str | None,
    *,
    now: int | None = None,
    freshness: Freshness | None = None,
    algorithm: str = ALGORITHM_ED25519,
    accepted: Collection[str] | None = None,
) -> MessageVerdict:
    """Verdict on ``message`` against the signer's registered key (None: signer unknown) of
    ``algorithm``; with ``accepted``, a key of an algorithm not in it is ``wrong_algorithm``.

    With ``now`` given, freshness is judged too (``freshness`` defaults to 5 min / 60 s).
    """
    if registered_key is None:
        return MessageVerdict(False, Reason.UNKNOWN_SIGNER, "no key is registered for the signer")
    verdict = verify_message(message, registered_key, algorithm, accepted)
    if not verdict.ok:
        reason = {
            "malformed_content": Reason.MALFORMED,
            "malformed_signature": Reason.BAD_SIGNATURE,
            "no_signature": Reason.BAD_SIGNATURE,
            "unsupported_algorithm": Reason.BAD_SIGNATURE,
        }.get(verdict.reason, verdict.reason)
        return MessageVerdict(
            False, reason, f"{verdict.reason}: {verdict.detail}".strip(": "), verdict.signer
        )
    if now is not None:
        stale = freshness_problem(message, now, freshness or Freshness())
        if stale is not None:
            return stale
    return MessageVerdict(True, "ok", "", verdict.signer)


def permission_problem(context: Context | None, ctx: int, actor_id: int) -> MessageVerdict | None:
    """The one permission rule, for actors' messages and flows alike: a failing verdict
    (``unknown_context``, ``permission_denied``) unless ``actor_id`` is an admin or executor of
    ``context`` (context ``ctx`` as the node holds it; None if it holds none), else None."""
    if context is None:
        return MessageVerdict(
            False, Reason.UNKNOWN_CONTEXT, f"context {ctx} does not exist on this node"
        )
    if not context.may_execute(actor_id):
        return MessageVerdict(
            False,
            Reason.PERMISSION_DENIED,
            f"actor {actor_id} is not admin/executor of context {ctx}",
        )
    return None
