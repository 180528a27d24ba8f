"""The msgspec codecs (bus/core/codecs.py) against the reference parsers they stand in front of.

For every hash, well-formed or hostile, ``from_hash`` (msgspec where it reads exactly, the
reference parser otherwise) gives what ``parse_hash`` (the reference, field by field) gives:
the same model, or the same ModelError in the same words. And the fast path is taken for what
the models write, so these checks are not about a path that never runs.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bus.core.codecs import MAX_INT, ascii_json, codec_of, loads_json
from bus.core.envelope import ResultBody, _decoded_body
from bus.core.frames import encode_msg_item
from bus.core.models import (
    Actor,
    Context,
    Flow,
    FlowStatus,
    JobStatus,
    Message,
    MessageFormat,
    MessageStatus,
    MessageType,
    RunnerJob,
    loads_text,
)
from bus.errors import ModelError

CHECKS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# text of every plane, control characters and lone surrogates included
every_char = st.text(st.characters(min_codepoint=0, blacklist_categories=()), max_size=12)
counts = st.integers(0, MAX_INT) | st.sampled_from([0, 2**53 - 1, 2**53, MAX_INT])
words = st.text(max_size=16) | every_char | st.sampled_from(["", "é", "😀", "\x00", "\x7f"])
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | every_char
    | st.sampled_from([True, -0.0, 5.0, 1e16]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(every_char, inner, max_size=4),
    max_leaves=10,
)
# what a count field may hold in a hostile hash: int() reads some of these, msgspec others
count_texts = st.integers(-(2**70), 2**70).map(str) | st.sampled_from(
    ["", "+1", " 1", "1 ", "1.0", "1e3", "1E3", "-0", "007", "٣", "0x10", "1_0", "nan", "inf"]
    + [str(MAX_INT), str(MAX_INT + 1), "true", "null"]
)
json_texts = st.builds(json.dumps, json_values, ensure_ascii=st.booleans()) | st.sampled_from(
    ["", "{", "[", "null", "[]", "{}", '["\\ud800"]', '{"a":"\\udc00"}', '["\\ud83d\\ude00"]']
    + ["NaN", "[1e400]", '{"a":"b","a":"c"}', "[" * 3000 + "]" * 3000, '"x"', "[1,]"]
)
hostile_values = (
    count_texts
    | json_texts
    | every_char
    | st.sampled_from(
        [s.value for e in (JobStatus, FlowStatus, MessageStatus, MessageType) for s in e]
    )
)


def outcome(parse, h):
    """What a parser makes of ``h``: the model (its repr, so NaN and -0.0 compare as written)
    or the reason it gives."""
    try:
        return "ok", repr(parse(h))
    except ModelError as exc:
        return "refused", str(exc)


def agree(cls, h) -> None:
    assert outcome(cls.from_hash, h) == outcome(cls.parse_hash, h)


@st.composite
def jobs(draw: st.DrawFn) -> RunnerJob:
    return RunnerJob(
        id=draw(counts),
        caller_id=draw(counts),
        context_id=draw(counts),
        script=draw(words),
        script_type=draw(words),
        timeout=draw(counts),
        retries=draw(counts),
        env_vars=draw(st.dictionaries(words, words, max_size=3)),
        result=draw(st.dictionaries(words, words, max_size=3)),
        prerequisites=draw(st.lists(words, max_size=3)),
        depends=draw(st.lists(counts, max_size=3)),
        created_at=draw(counts),
        updated_at=draw(counts),
        status=draw(st.sampled_from(JobStatus)),
        message_key=draw(words),
        reason=draw(words),
        group=draw(words),
        instance=draw(words),
        priority=draw(st.sampled_from(["", "high", "low"])),
        retry_on=draw(st.lists(st.sampled_from(["timeout", "exit:3", "exit:any"]), max_size=2)),
        backoff=draw(st.sampled_from(["", "linear", "exponential"])),
        backoff_ms=draw(st.integers(0, 3_600_000)),
    )


@st.composite
def messages(draw: st.DrawFn) -> Message:
    return Message(
        id=draw(counts),
        caller_id=draw(counts),
        context_id=draw(counts),
        message=draw(words),
        message_type=draw(st.sampled_from(MessageType)),
        message_format_type=draw(st.sampled_from(MessageFormat)),
        timeout=draw(counts),
        timeout_ack=draw(counts),
        timeout_result=draw(counts),
        job=draw(st.lists(jobs(), max_size=2)),
        logs=draw(st.lists(st.dictionaries(words, json_values, max_size=2), max_size=2)),
        created_at=draw(counts),
        updated_at=draw(counts),
        status=draw(st.sampled_from(MessageStatus)),
        origin=draw(words),
        destination=draw(words),
        nonce=draw(words),
        signatures=draw(st.lists(st.dictionaries(words, words, max_size=3), max_size=2)),
        reason=draw(words),
        reply_to=draw(words),
        traceparent=draw(words),
        tracestate=draw(words),
    )


registry = st.one_of(
    st.builds(Actor, counts, words, st.lists(words, max_size=2), counts, counts, words),
    st.builds(
        Context,
        counts,
        st.lists(counts, max_size=3),
        st.lists(counts, max_size=3),
        st.lists(counts, max_size=3),
        counts,
        counts,
    ),
    st.builds(
        Flow,
        counts,
        counts,
        counts,
        st.lists(counts, max_size=3),
        st.dictionaries(words, words, max_size=2),
        st.dictionaries(words, words, max_size=2),
        counts,
        counts,
        st.sampled_from(FlowStatus),
    ),
)
models = jobs() | messages() | registry


def _unicode(*values) -> bool:
    """Whether every string in ``values`` is Unicode text (no lone surrogate)."""
    try:
        json.dumps(values, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


def _storable(model) -> bool:
    """Whether what a model writes is Unicode text (what Redis gives back is: decode_hash) and
    standard JSON: a message's logs may hold NaN or Infinity, which json writes and reads
    and msgspec leaves to it."""
    try:
        json.dumps(getattr(model, "logs", []), allow_nan=False)
    except ValueError:
        return False
    return _unicode(model.to_hash())


@CHECKS
@given(models)
def test_what_a_model_writes_is_read_back_in_c_as_the_reference_reads_it(model):
    h = model.to_hash()
    assert codec_of(type(model)).decode(h) is not None or not _storable(model)
    agree(type(model), h)


@CHECKS
@given(models, st.data())
def test_a_hostile_hash_gets_what_the_reference_gives(model, data):
    """Any field replaced by text int() or msgspec reads differently, JSON of every kind, text
    of every plane; fields dropped; the spec's ``dependends`` beside or instead of ``depends``."""
    h = dict(model.to_hash())
    names = sorted(h) + ["dependends", "algorithm"]
    for name in data.draw(st.lists(st.sampled_from(names), max_size=3)):
        h[name] = data.draw(hostile_values)
    for name in data.draw(st.lists(st.sampled_from(names), max_size=2)):
        h.pop(name, None)
    agree(type(model), h)


entry_values = (
    st.sampled_from([None, True, False, 5.0, -1, 2**64, "5", "", [], {}, ["a"], [1], {"a": 1}])
    | json_values
)


@CHECKS
@given(st.lists(jobs(), min_size=1, max_size=3), st.data())
def test_a_hostile_job_entry_of_a_message_gets_what_the_reference_gives(job_list, data):
    """A message's ``job`` list read in C (every entry one RunnerJob) or the reference way
    (each entry's fields printed back to text and parsed as a job hash): the same jobs."""
    message = Message(1, 2, 3, message_type=MessageType.JOB, job=job_list, origin="o")
    h = message.to_hash() | {"destination": "d", "created_at": "5"}
    entries = json.loads(h["job"])
    for entry in entries:
        for name in data.draw(st.lists(st.sampled_from([*entry, "dependends", "status"]))):
            entry[name] = data.draw(entry_values)
    h["job"] = json.dumps(entries, ensure_ascii=data.draw(st.booleans()))
    agree(Message, h)


def test_each_way_the_reference_reads_a_count_is_the_way_from_hash_reads_it():
    """The cases that set the fast path apart, one by one: msgspec reads "1.0" and "1e3" as
    counts, int() refuses them; int() reads "+1", " 1" and "٣", msgspec refuses them."""
    base = RunnerJob(1, 2, 3, "x", "python").to_hash()
    for text in ["1.0", "1e3", "+1", " 1", "٣", "007", "", "-0", str(MAX_INT + 1)]:
        agree(RunnerJob, base | {"timeout": text})
    assert RunnerJob.from_hash(base | {"timeout": "٣"}).timeout == 3
    with pytest.raises(ModelError, match="'timeout' is not an integer: '1e3'"):
        RunnerJob.from_hash(base | {"timeout": "1e3"})


def test_an_integer_beyond_64_bits_in_a_json_field_stays_exact():
    """json.loads keeps it exact; orjson (the parser before msgspec) made it a float, so a
    message's logs read back other than they were written."""
    raw = "[-9223372036854775809, 18446744073709551616, 1.5]"
    assert loads_text(raw, "field") == [-(2**63) - 1, 2**64, 1.5]
    message = Message(1, 2, 3, logs=[{"n": -(2**63) - 1}], origin="o", destination="d")
    assert Message.from_hash(message.to_hash()).logs == [{"n": -(2**63) - 1}]
    assert Message.parse_hash(message.to_hash()).logs == [{"n": -(2**63) - 1}]


def test_the_spec_spelling_and_a_bad_retry_policy_read_the_same_both_ways():
    h = RunnerJob(1, 2, 3, "x", "python").to_hash()
    del h["depends"]
    assert RunnerJob.from_hash(h | {"dependends": "[4]"}).depends == [4]
    with pytest.raises(ModelError, match="field 'backoff' is 'slow'"):
        RunnerJob.from_hash(h | {"backoff": "slow"})
    m = Message(1, 2, 3, job=[RunnerJob(4, 2, 3, "x", "python")], origin="o", destination="d")
    mh = m.to_hash()
    mh["job"] = mh["job"].replace('"script"', '"dependends":[7],"script"')
    assert Message.from_hash(mh).job[0].depends == [7]
    mh["job"] = mh["job"].replace('"dependends":[7]', '"retry_on":["exit:300"]')
    with pytest.raises(ModelError, match="field 'retry_on' holds 'exit:300'"):
        Message.from_hash(mh)


# -- a result body: the bytes a result's signature covers, and what a node reads back -----------


def reference_encode(body: ResultBody) -> str:
    return json.dumps(
        {
            "in_reply_to": body.in_reply_to,
            "job_key": body.job_key,
            "status": body.status.value,
            "result": body.result,
            "reason": body.reason,
        },
        separators=(",", ":"),
        sort_keys=True,
    )


bodies = st.builds(
    ResultBody,
    words,
    words,
    st.sampled_from(JobStatus),
    st.dictionaries(words, words, max_size=4) | st.dictionaries(words, json_values, max_size=2),
    words,
)


@CHECKS
@given(bodies)
def test_a_result_body_is_written_byte_for_byte_as_json_dumps_wrote_it(body):
    try:
        expected = reference_encode(body)
    except (TypeError, ValueError) as exc:  # what json refuses, encode refuses the same way
        with pytest.raises(type(exc)):
            body.encode()
        return
    assert body.encode() == expected


@CHECKS
@given(
    st.dictionaries(
        st.sampled_from(["in_reply_to", "job_key", "status", "result", "reason", "x"]),
        st.sampled_from([s.value for s in JobStatus]) | entry_values,
        max_size=6,
    ),
    st.booleans(),
)
def test_a_result_body_is_read_as_the_reference_reads_it(fields, ascii_only):
    text = json.dumps(fields, ensure_ascii=ascii_only)
    assert outcome(ResultBody.decode, text) == outcome(ResultBody.parse, text)


@CHECKS
@given(bodies)
def test_a_result_body_written_is_read_back_in_c(body):
    text = body.encode()
    textual = all(type(v) is str for v in body.result.values()) and _unicode(
        body.result, body.reason, body.in_reply_to, body.job_key
    )
    assert _decoded_body(text) is not None or not textual
    assert outcome(ResultBody.decode, text) == outcome(ResultBody.parse, text)


# -- JSON text: what json.loads reads, what json.dumps writes ----------------------------------


def json_loads_outcome(load, raw):
    try:
        return "ok", repr(load(raw))
    except RecursionError:
        return "refused", "RecursionError"
    except ValueError as exc:  # json's own error: its words, whichever parser ran first
        return "refused", f"{type(exc).__name__}: {exc}"


@CHECKS
@given(
    json_texts
    | st.builds(
        lambda v, a: json.dumps(v, ensure_ascii=a).encode("utf-8", "surrogatepass"),
        json_values,
        st.booleans(),
    )
    | st.builds(
        lambda v: json.dumps(v, ensure_ascii=False).encode("utf-16", "surrogatepass"), json_values
    )
    | st.binary(max_size=40)
    | every_char
)
def test_a_json_text_is_read_as_json_loads_reads_it(raw):
    """Frames, replies and a hash's JSON fields (loads_json: msgspec, else json.loads) read to
    json.loads' very values, and fail with its very errors."""
    assert json_loads_outcome(loads_json, raw) == json_loads_outcome(json.loads, raw)


@CHECKS
@given(st.integers(0, 2**70), words, st.dictionaries(words, words, max_size=6))
def test_a_frame_item_is_written_byte_for_byte_as_json_dumps_wrote_it(ctx, key, fields):
    """A msgs frame's item, sized by its length as ASCII: ascii_json's bytes are json's."""
    item = {"ctx": ctx, "key": key, "fields": fields}
    try:
        expected = json.dumps(item, separators=(",", ":"))
    except (TypeError, ValueError):
        return
    assert encode_msg_item(ctx, key, fields) == expected
    assert ascii_json(item, sort_keys=True) == json.dumps(
        item, separators=(",", ":"), sort_keys=True
    )
