"""Every exception the project raises on purpose sits under its package's root."""

from __future__ import annotations

from bus.core.reasons import Reason
from bus.core.verify import permission_problem
from bus.errors import BusError, ContentError, FlowError
from crypto.cli import InputError as CliInputError
from crypto.errors import CryptoError, InputError
from node.errors import HomeInUse, NodeError, Rejected, ValkeyError
from node.host.homelock import HomeInUse as HomelockHomeInUse
from node.intake.messages import Rejected as MessagesRejected


def test_each_error_is_under_its_root_and_importable_where_callers_look() -> None:
    assert issubclass(FlowError, BusError)
    assert issubclass(ContentError, BusError)
    assert issubclass(InputError, CryptoError)
    assert CliInputError is InputError
    for error in (HomeInUse, ValkeyError, Rejected):
        assert issubclass(error, NodeError)
    assert MessagesRejected is Rejected
    assert HomelockHomeInUse is HomeInUse


def test_rejected_carries_its_reason_and_a_printable_detail() -> None:
    refused = Rejected(Reason.MALFORMED, "bad \ud800")
    assert refused.reason == "malformed"
    assert refused.detail.isprintable()
    assert str(refused).startswith("malformed: ")
    by_peer = Rejected.by_peer("oversize", "too big")
    assert (by_peer.reason, str(by_peer)) == (
        "peer_refused_oversize",
        "peer_refused_oversize: too big",
    )
    denied = permission_problem(None, 7, 1)
    assert denied is not None
    by_verdict = Rejected.by_verdict(denied)
    assert (by_verdict.reason, by_verdict.detail) == (denied.reason, denied.detail)
    about = Rejected.by_verdict(denied, "actor 1")
    assert (about.reason, about.detail) == ("unknown_context", f"actor 1: {denied.detail}")
