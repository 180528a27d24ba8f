"""``Message.signed_json`` (msgspec, from the fields) against the reference it stands in for,
``canonical_json(message.signed_content())``: the same bytes for every message, well-formed or
hostile, or the same error. And the C path is the one a message takes, so these checks are not
about a path that never runs."""

from __future__ import annotations

import enum
from dataclasses import replace

import msgspec
import pytest
from hypothesis import given

import bus.core.models as models
from bus.core.models import Message, RunnerJob
from crypto import canonical_json
from tests.bus.test_codecs import CHECKS, messages


def outcome(make):  # noqa: ANN001, ANN201
    try:
        return "ok", make()
    except Exception as exc:  # noqa: BLE001 - the same error, whatever it is
        return type(exc).__name__, str(exc)


def agree(message: Message) -> None:
    assert outcome(message.signed_json) == outcome(lambda: canonical_json(message.signed_content()))


@CHECKS
@given(messages())
def test_the_bytes_of_the_reference_for_every_message(message: Message) -> None:
    agree(message)


class _Small(enum.IntEnum):
    A = 5


class _Priority(enum.StrEnum):
    HIGH = "high"


class _Text(str):
    pass


_JOB = RunnerJob(id=1, caller_id=2, context_id=3, script="x", script_type="python")
_MESSAGE = Message(id=1, caller_id=2, context_id=3, job=[_JOB], origin="o", destination="d")


def _job(**changes: object) -> Message:
    return replace(_MESSAGE, job=[replace(_JOB, **changes)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "message",
    [
        replace(_MESSAGE, message="".join(chr(i) for i in range(128))),  # every ASCII escape
        replace(_MESSAGE, message="é😀", nonce="\ufeff"),
        replace(_MESSAGE, id=True),  # type: ignore[arg-type]
        replace(_MESSAGE, timeout=_Small.A),
        replace(_MESSAGE, timeout=1.0),  # type: ignore[arg-type]
        replace(_MESSAGE, id=2**53),
        replace(_MESSAGE, id=2**53 - 1, caller_id=-(2**53 - 1)),
        replace(_MESSAGE, id=-(2**53)),
        replace(_MESSAGE, origin=_Text("zz")),
        replace(_MESSAGE, reply_to=5),  # type: ignore[arg-type]
        replace(_MESSAGE, nonce=None),  # type: ignore[arg-type]
        replace(_MESSAGE, message_type="job"),  # type: ignore[arg-type]
        replace(_MESSAGE, message_type="no-such-type"),  # type: ignore[arg-type]
        replace(_MESSAGE, job=(_JOB,)),  # type: ignore[arg-type]
        replace(_MESSAGE, job=[{"id": 1}]),  # type: ignore[list-item]
        _job(priority=_Priority.HIGH),
        _job(prerequisites=("a", "b")),
        _job(env_vars={"\U0001f600": "a", "\uff01": "b"}),  # UTF-16 order differs from code points
        _job(env_vars={"b": "1", "a": "2", "é": "3"}),
        _job(env_vars={"a": 1}),
        _job(env_vars=None),
        _job(script="\ud800"),  # a lone surrogate
        _job(depends=[2**60]),
        _job(retry_on=["timeout"], backoff="linear", backoff_ms=3, group="g", instance="i"),
    ],
)
def test_the_bytes_or_the_error_of_the_reference_for_hostile_fields(message: Message) -> None:
    agree(message)


def test_a_message_is_printed_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the reference at hand, a well-formed message still prints: the C path ran."""
    message = _job(env_vars={"B": "1", "A": "2"}, retry_on=["timeout"])
    expected = canonical_json(message.signed_content())

    def no_reference(value: object) -> bytes:
        raise AssertionError("the reference path ran")

    monkeypatch.setattr(models, "canonical_json", no_reference)
    assert message.signed_json() == expected


def test_the_printed_fields_are_the_signed_ones() -> None:
    """A field added to what the signature covers is added to the printed view too."""
    job_fields = msgspec.structs.fields(models._SignedJob)
    message_fields = msgspec.structs.fields(models._SignedMessage)
    assert {f.name for f in job_fields} == set(models._JOB_SIGNED)
    assert {f.name for f in message_fields} == {*Message.SIGNED, "job", *models._SIGNED_WHEN_SET}
    # the fields signed only when set are those with a default, and it is their empty value
    when_set = {
        f.name: f.default_factory() if f.default is msgspec.NODEFAULT else f.default
        for f in (*message_fields, *job_fields)
        if not f.required
    }
    assert set(when_set) == {
        *models._SIGNED_WHEN_SET,
        *RunnerJob.TARGETING,
        *RunnerJob.RETRY_POLICY,
    }
    assert all(not default for default in when_set.values())
