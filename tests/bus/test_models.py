"""The data model against the coordinator spec: key patterns, fields, statuses, round trips."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus.core import keys
from bus.core.frames import decode_frame
from bus.core.models import (
    _SURROGATE_ESCAPE,
    Actor,
    Context,
    Flow,
    FlowStatus,
    JobStatus,
    Message,
    MessageFormat,
    MessageStatus,
    MessageType,
    Runner,
    RunnerJob,
    _dump,
    json_arg,
    loads_text,
)
from bus.errors import ModelError

# Key patterns and statuses, copied from shared/seeds/coordinator-specs.md section 3.
SPEC_PATTERNS = {
    "actor": r"actor:\d+",
    "context": r"context:\d+",
    "flow": r"flow:\d+",
    "message": r"message:\d+:\d+",
    "runner": r"runner:[^:]+",
    "job": r"job:\d+:\d+",
}
SPEC_FIELDS = {
    Actor: "id pubkey address created_at updated_at",
    Context: "id admins readers executors created_at updated_at",
    Flow: "id caller_id context_id jobs env_vars result created_at updated_at status",
    Message: "id caller_id context_id message message_type message_format_type timeout "
    "timeout_ack timeout_result job logs created_at updated_at status",
    Runner: "id pubkey address topic local created_at updated_at",
    RunnerJob: "id caller_id context_id script script_type timeout retries env_vars result "
    "prerequisites created_at updated_at status",
}


def test_key_schema_matches_spec_patterns():
    built = {
        "actor": keys.actor(12),
        "context": keys.context(7),
        "flow": keys.flow(33),
        "message": keys.message(12, 101),
        "runner": keys.runner("20"),
        "job": keys.job(12, 2001),
    }
    for name, key in built.items():
        assert re.fullmatch(SPEC_PATTERNS[name], key), (name, key)
    assert built["message"] == "message:12:101"
    assert built["job"] == "job:12:2001"
    assert (keys.MSG_OUT, keys.MSG_IN, keys.queue("python")) == (
        "msg_out",
        "msg_in",
        "queue:python",
    )
    assert keys.queue_instance("v", "g", "i") == "queue:v:group:g:inst:i"
    assert keys.parse_message_key("message:12:101") == (12, 101)
    with pytest.raises(ValueError, match="not a message key"):
        keys.parse_message_key("job:12:101")


def test_every_spec_field_is_stored():
    samples = {
        Actor: Actor(1, "ab" * 32),
        Context: Context(1),
        Flow: Flow(1, 2, 3),
        Message: Message(1, 2, 3, origin="a", destination="b"),
        Runner: Runner("r1"),
        RunnerJob: RunnerJob(1, 2, 3, "print(1)", "python"),
    }
    for cls, fields in SPEC_FIELDS.items():
        stored = samples[cls].to_hash()
        assert set(fields.split()) <= set(stored), cls.__name__
    assert "depends" in samples[RunnerJob].to_hash()


def test_status_enums_are_spelled_as_in_the_spec():
    assert [s.value for s in JobStatus] == [
        "dispatched",
        "waiting_for_prerequisites",
        "started",
        "error",
        "finished",
    ]
    assert {s.value for s in FlowStatus} == {"dispatched", "started", "error", "finished"}
    assert {s.value for s in MessageStatus} == {"dispatched", "acknowledged", "error", "processed"}
    assert {"job", "chat", "mail"} <= {t.value for t in MessageType}
    assert {f.value for f in MessageFormat} == {"html", "text", "md"}


def test_spec_spelling_dependends_is_accepted_on_read():
    h = RunnerJob(1, 2, 3, "x", "python").to_hash()
    del h["depends"]
    h["dependends"] = "[4,5]"
    assert RunnerJob.from_hash(h).depends == [4, 5]


ids = st.integers(min_value=0, max_value=2**53 - 1)
text = st.text(max_size=30)
smap = st.dictionaries(text, text, max_size=4)


@st.composite
def jobs(draw: st.DrawFn) -> RunnerJob:
    return RunnerJob(
        id=draw(ids),
        caller_id=draw(ids),
        context_id=draw(ids),
        script=draw(text),
        script_type=draw(st.sampled_from(["python", "sh", "v"])),
        timeout=draw(ids),
        retries=draw(st.integers(0, 255)),
        env_vars=draw(smap),
        result=draw(smap),
        prerequisites=draw(st.lists(text, max_size=3)),
        depends=draw(st.lists(ids, max_size=3)),
        created_at=draw(ids),
        updated_at=draw(ids),
        status=draw(st.sampled_from(JobStatus)),
        message_key=draw(text),
        reason=draw(text),
    )


@given(jobs())
def test_job_round_trip(job: RunnerJob):
    assert RunnerJob.from_hash(job.to_hash()) == job


@given(st.lists(jobs(), max_size=3), ids, ids, text, st.sampled_from(MessageStatus))
def test_message_round_trip(job_list, caller, ident, body, status):
    # a message carries the signed part of its jobs, so compare that part
    msg = Message(
        ident,
        caller,
        1,
        message=body,
        job=job_list,
        origin="o",
        destination="d",
        status=status,
        signatures=[{"algorithm": "ed25519", "public_key": "p", "signature": "s"}],
    )
    back = Message.from_hash(msg.to_hash())
    assert back.signed_content() == msg.signed_content()
    assert back.status == status
    assert back.signatures == msg.signatures


@given(ids, st.lists(ids, max_size=4), st.lists(ids, max_size=4), smap)
def test_context_flow_actor_round_trip(i, admins, execs, env):
    assert Context.from_hash(Context(i, admins, [], execs).to_hash()) == Context(
        i, admins, [], execs
    )
    flow = Flow(i, i, i, jobs=admins, env_vars=env, status=FlowStatus.STARTED)
    assert Flow.from_hash(flow.to_hash()) == flow
    actor = Actor(i, "ab" * 32, ["addr"])
    assert Actor.from_hash(actor.to_hash()) == actor


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("id", "x", "'id' is not an integer"),
        ("id", "-3", "'id' is negative"),
        ("env_vars", "[1]", "'env_vars' must be a JSON dict"),
        ("env_vars", "{", "'env_vars' is not valid JSON"),
        ("depends", '["a"]', "'depends' must be a list of non-negative integers"),
        ("status", "done", "expected one of dispatched|"),
    ],
)
def test_malformed_job_hash_names_the_field(field, value, needle):
    h = RunnerJob(1, 2, 3, "x", "python").to_hash() | {field: value}
    with pytest.raises(ModelError, match=re.escape(needle)):
        RunnerJob.from_hash(h)


def test_missing_field_is_named():
    h = Message(1, 2, 3, origin="a", destination="b").to_hash()
    del h["origin"]
    with pytest.raises(ModelError, match="missing field 'origin'"):
        Message.from_hash(h)


@given(
    st.one_of(
        st.binary(max_size=200),
        st.text(max_size=200),
        st.dictionaries(
            st.sampled_from(["t", "ctx", "key", "fields", "v", "node"]),
            st.one_of(st.integers(), st.text(), st.none()),
            max_size=5,
        ).map(lambda d: __import__("json").dumps(d)),
    )
)
def test_frame_decoder_never_raises_anything_but_frame_error(data):
    from bus.errors import FrameError

    try:
        frame = decode_frame(data, max_bytes=1000)
    except FrameError:
        return
    assert frame.type in {"hello", "auth", "welcome", "msgs", "acks"}


# Any JSON value json.dumps can print: floats, integers beyond 64 bits (orjson read them as
# floats), text of every plane, lone surrogates included, deep enough to nest.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(json_values, st.booleans())
def test_json_fields_parse_as_json_loads_parses_them(value, ascii_only):
    """loads_text's fast path (msgspec) gives what json.loads gives, and refuses what it
    refused: the parsed message, and so its signed content, is the same either way."""
    raw = json.dumps(value, ensure_ascii=ascii_only)
    try:
        expected = json.loads(raw)
        if _SURROGATE_ESCAPE.search(raw):
            json.dumps(expected, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError, UnicodeEncodeError):
        with pytest.raises(ModelError):
            loads_text(raw, "field")
        return
    assert loads_text(raw, "field") == expected


# text of every plane with control characters and lone surrogates, which json and orjson
# escape, print or refuse each their own way if they differ at all
every_char = st.text(st.characters(min_codepoint=0, blacklist_categories=()), max_size=12)
stored_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | every_char,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(every_char, inner, max_size=4),
    max_leaves=12,
)


@given(stored_values)
def test_a_stored_json_field_is_what_json_dumps_writes(value):
    """A message's and a job's JSON fields (``job``, ``signatures``, maps, lists) are written
    by orjson where it can: byte for byte what json.dumps wrote, so a stored hash is the same
    whichever wrote it (floats, which the two print differently, go to json)."""
    assert _dump(value) == json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# what a script's JSON argument holds: keys, fields and counts (no floats, which orjson prints
# otherwise: inf as null)
script_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(script_values)
def test_a_script_argument_decodes_to_what_json_dumps_gives(value):
    """A script's JSON argument (orjson, json.dumps where orjson refuses) decodes to the same
    value as json.dumps printed."""
    assert json.loads(json_arg(value)) == json.loads(json.dumps(value))


@given(jobs())
def test_a_job_entry_parses_as_its_fields_dumped_one_by_one(job):
    """from_signed_dict prints an int field itself; the job is the one json.dumps of each
    field gave."""
    entry = json.loads(json.dumps(job.signed_dict()))
    flat = {
        k: v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
        for k, v in entry.items()
    }
    assert RunnerJob.from_signed_dict(entry) == RunnerJob.from_hash(flat)
