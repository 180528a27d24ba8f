"""Property tests for canonical encoding, strict parsing and signatures."""

from __future__ import annotations

import json
import random

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crypto.errors import CanonicalError
from crypto.signing import (
    DOMAIN_PREFIX,
    MAX_SAFE_INTEGER,
    KeyPair,
    _fast_admits,
    _jcs_bytes,
    canonical_json,
    sign_object,
    signing_input,
    verify_object,
    verify_raw,
)
from crypto.strict_json import loads_strict

KEY = KeyPair.from_seed(bytes(range(32)))
OTHER_KEY = KeyPair.from_seed(bytes(range(1, 33)))

safe_ints = st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
scalars = st.none() | st.booleans() | safe_ints | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)
domains = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=20)


def _shuffled(value: object, rng: random.Random) -> object:
    """Same JSON value with every object's key order shuffled."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: _shuffled(item, rng) for key, item in items}
    if isinstance(value, list):
        return [_shuffled(item, rng) for item in value]
    return value


def _with_float(value: object, rng: random.Random, number: float) -> object:
    """Replace one randomly chosen leaf (or wrap the value) so that a float appears somewhere."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        return {**value, key: _with_float(value[key], rng, number)}
    if isinstance(value, list) and value and rng.random() < 0.8:
        index = rng.randrange(len(value))
        return value[:index] + [_with_float(value[index], rng, number)] + value[index + 1 :]
    return rng.choice([number, [value, number], {"x": number, "y": value}])


@given(
    value=json_values,
    seed=st.integers(),
    indent=st.none() | st.integers(min_value=0, max_value=4) | st.just("\t"),
    separators=st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : "), (",\n", ":\t")]),
    ensure_ascii=st.booleans(),
)
def test_key_order_and_whitespace_do_not_change_canonical_bytes(
    value, seed, indent, separators, ensure_ascii
):
    text = json.dumps(
        _shuffled(value, random.Random(seed)),
        indent=indent,
        separators=separators,
        ensure_ascii=ensure_ascii,
    )
    parsed = loads_strict(text)
    assert parsed == value
    assert canonical_json(parsed) == canonical_json(value)
    assert loads_strict(canonical_json(value)) == value


@given(value=json_values)
def test_canonical_bytes_are_compact_sorted_utf8(value):
    # For integer-only content JCS equals compact json.dumps with keys in UTF-16 order.
    data = canonical_json(value)
    assert data.decode("utf-8") == json.dumps(
        _sort_utf16(value), separators=(",", ":"), ensure_ascii=False
    )


# Keys drawn from characters that sort differently in UTF-16 and in code points (private-use
# BMP characters against astral ones), mixed with ASCII and escapes.
tricky_text = st.text(
    alphabet=st.sampled_from(
        [
            "a",
            "Z",
            "\ue000",
            "\ufffd",
            "\U0001f600",
            "\U00010000",
            '"',
            "\\",
            "\n",
            "\x00",
            "\x1f",
            "\x7f",
            "\u2028",
            "\u00e9",
        ]
    ),
    max_size=6,
)
tricky_values = st.recursive(
    st.none() | st.booleans() | safe_ints | tricky_text,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(tricky_text, children, max_size=5)
    ),
    max_leaves=25,
)


@given(value=json_values | tricky_values)
def test_fast_canonical_path_equals_the_rfc8785_reference(value):
    assert canonical_json(value) == _jcs_bytes(value)


def _has_astral_key(value: object) -> bool:
    if isinstance(value, dict):
        return any(max(k, default="a") > "\uffff" or _has_astral_key(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_astral_key(v) for v in value)
    return False


@given(value=json_values | tricky_values)
def test_orjson_fast_path_prints_rfc8785_wherever_the_guard_admits(value):
    # the property the hot path rests on: guard admits => orjson's bytes are the reference's
    admitted = _fast_admits(value)
    assert admitted == (not _has_astral_key(value))
    if admitted:
        assert orjson.dumps(value, option=orjson.OPT_SORT_KEYS) == _jcs_bytes(value)


class _Text(str):
    pass


class _Number(int):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {"\U0001f600": 1, "\ue000": 2},  # UTF-16 order differs from code-point order
        {"a": _Text("x")},  # subclasses go the reference way
        [_Number(3)],
        {"a": [(1, "b")]},
    ],
)
def test_guard_routes_other_content_to_the_reference(value):
    assert canonical_json(value) == _jcs_bytes(value)


def test_guard_refuses_what_orjson_would_print_wrongly():
    # orjson prints floats, NaN (as null) and 64-bit integers; the guard must not admit them
    for value in ({"a": 1.0}, [float("nan")], [2**53], {"a": [2**63 - 1]}, {"a": -(2**53)}):
        assert not _fast_admits(value)
        with pytest.raises(CanonicalError):
            canonical_json(value)


def _sort_utf16(value: object) -> object:
    if isinstance(value, dict):
        keys = sorted(value, key=lambda key: key.encode("utf-16-be"))
        return {key: _sort_utf16(value[key]) for key in keys}
    if isinstance(value, list):
        return [_sort_utf16(item) for item in value]
    return value


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values, data=st.data())
def test_any_byte_change_breaks_signature(value, data):
    message = signing_input("job", value)
    signature = KEY.sign(message)
    assert verify_raw(KEY.public_bytes, message, signature)

    index = data.draw(st.integers(min_value=0, max_value=len(message) - 1))
    flip = data.draw(st.integers(min_value=1, max_value=255))
    mutated = bytearray(message)
    mutated[index] ^= flip
    assert not verify_raw(KEY.public_bytes, bytes(mutated), signature)

    sig_index = data.draw(st.integers(min_value=0, max_value=63))
    bad_signature = bytearray(signature)
    bad_signature[sig_index] ^= flip
    assert not verify_raw(KEY.public_bytes, message, bytes(bad_signature))


@given(value=json_values, other=json_values)
def test_verify_object_fails_on_changed_value(value, other):
    signatures = [sign_object(KEY, "job", value)]
    verdict = verify_object(signatures, "job", value, expected_public_key=KEY.public_hex)
    assert verdict.ok
    assert verdict.reason == "ok"
    assert verdict.signer == KEY.public_hex
    changed = verify_object(signatures, "job", other)
    if canonical_json(other) == canonical_json(value):
        assert changed.ok
    else:
        assert not changed.ok
        assert changed.reason == "bad_signature"


@given(value=json_values)
def test_verify_object_fails_on_wrapped_value(value):
    signatures = [sign_object(KEY, "job", value)]
    for mutated in ([value], {"v": value}, [value, None]):
        verdict = verify_object(signatures, "job", mutated)
        assert not verdict.ok
        assert verdict.reason == "bad_signature"


@given(
    value=json_values,
    seed=st.integers(),
    number=st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 1.0, -0.0]),
)
def test_float_anywhere_is_refused(value, seed, number):
    with_float = _with_float(value, random.Random(seed), number)
    with pytest.raises(CanonicalError):
        canonical_json(with_float)
    with pytest.raises(CanonicalError):
        signing_input("job", with_float)
    verdict = verify_object([sign_object(KEY, "job", value)], "job", with_float)
    assert not verdict.ok
    assert verdict.reason == "malformed_content"


@given(number=st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(["1e5", "-0.0"]))
def test_float_literals_refused_by_loads_strict(number):
    text = number if isinstance(number, str) else repr(number)  # always has "." or "e"
    with pytest.raises(CanonicalError, match="floats are not allowed"):
        loads_strict(f'{{"a": [1, {text}]}}')


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_constants_refused(constant):
    with pytest.raises(CanonicalError, match="not valid JSON"):
        loads_strict(f"[{constant}]")


@given(
    key=st.text(max_size=10),
    first=json_values,
    second=json_values,
    prefix=st.dictionaries(st.text(max_size=5), scalars, max_size=3),
)
def test_duplicate_keys_refused(key, first, second, prefix):
    members = [json.dumps(k) + ":" + json.dumps(v) for k, v in prefix.items() if k != key]
    members += [
        json.dumps(key) + ":" + json.dumps(first),
        json.dumps(key) + ":" + json.dumps(second),
    ]
    text = "{" + ",".join(members) + "}"
    with pytest.raises(CanonicalError, match="duplicate object key"):
        loads_strict(text)
    with pytest.raises(CanonicalError, match="duplicate object key"):
        loads_strict(f'[1, {{"nested": {text}}}]')


@given(
    magnitude=st.integers(min_value=MAX_SAFE_INTEGER + 1) | st.sampled_from([2**53, 2**64, 10**30]),
    negative=st.booleans(),
)
def test_unsafe_integers_refused(magnitude, negative):
    number = -magnitude if negative else magnitude
    with pytest.raises(CanonicalError, match="2\\*\\*53"):
        canonical_json({"n": [number]})
    with pytest.raises(CanonicalError):
        loads_strict(str(number))


@given(key=st.integers() | st.none() | st.tuples(st.integers()) | st.booleans())
def test_non_string_keys_refused(key):
    with pytest.raises(CanonicalError, match="not a string"):
        canonical_json({key: 1})


@pytest.mark.parametrize("value", [{1, 2}, b"bytes", object(), 1j, {"a": frozenset()}])
def test_unsupported_types_refused(value):
    with pytest.raises(CanonicalError, match="unsupported type"):
        canonical_json(value)


@pytest.mark.parametrize("value", ["\ud800", {"\udfff": 1}, ["a\ud83d"]])
def test_lone_surrogates_refused(value):
    with pytest.raises(CanonicalError):
        canonical_json(value)


def test_deep_nesting_refused():
    deep: object = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(CanonicalError, match="nesting"):
        canonical_json(deep)
    with pytest.raises(CanonicalError, match="nested too deeply"):
        loads_strict("[" * 100_000 + "]" * 100_000)


def test_tuple_and_list_encode_alike():
    assert canonical_json((1, "a", (True, None))) == canonical_json([1, "a", [True, None]])
    assert canonical_json((1, "a", (True, None))) == b'[1,"a",[true,null]]'


@given(domain_a=domains, domain_b=domains, value=json_values)
def test_domains_separate_signatures(domain_a, domain_b, value):
    input_a = signing_input(domain_a, value)
    assert input_a == (DOMAIN_PREFIX + domain_a + "\n").encode() + canonical_json(value)
    signatures = [sign_object(KEY, domain_a, value)]
    assert verify_object(signatures, domain_a, value).ok
    if domain_a != domain_b:
        assert signing_input(domain_b, value) != input_a
        verdict = verify_object(signatures, domain_b, value)
        assert not verdict.ok
        assert verdict.reason == "bad_signature"


@pytest.mark.parametrize(
    "domain", ["", "Job", "job\n", "a b", "job/x", "é", "job\x00", "x.y", 7, None]
)
def test_invalid_domains_refused(domain):
    with pytest.raises(CanonicalError, match="invalid signing domain"):
        signing_input(domain, {})


@given(value=json_values)
def test_wrong_signer_detected(value):
    signatures = [sign_object(OTHER_KEY, "job", value)]
    verdict = verify_object(signatures, "job", value, expected_public_key=KEY.public_hex)
    assert not verdict.ok
    assert verdict.reason == "wrong_signer"
    assert verdict.signer == OTHER_KEY.public_hex
    both = [*signatures, sign_object(KEY, "job", value)]
    accepted = verify_object(both, "job", value, expected_public_key=KEY.public_hex.upper())
    assert accepted.ok
    assert accepted.signer == KEY.public_hex


garbage = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["algorithm", "public_key", "signature", "x"]) | st.text(max_size=3),
            children,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@given(signatures=garbage)
def test_verify_object_never_raises_on_garbage(signatures):
    verdict = verify_object(signatures, "job", {"a": 1}, expected_public_key=KEY.public_hex)
    assert verdict.ok is False
    assert verdict.reason in {
        "no_signature",
        "malformed_signature",
        "unsupported_algorithm",
        "bad_signature",
    }


@given(
    public_key=st.binary(max_size=40) | st.text(max_size=70) | st.none(),
    message=st.binary(max_size=10),
    signature=st.binary(max_size=70) | st.text(max_size=3) | st.integers(),
)
def test_verify_raw_never_raises(public_key, message, signature):
    assert verify_raw(public_key, message, signature) is False


def test_integer_boundaries():
    # rfc8785 itself accepts exactly +/-(2**53 - 1) and raises IntegerDomainError beyond.
    assert (
        canonical_json([MAX_SAFE_INTEGER, -MAX_SAFE_INTEGER])
        == b"[9007199254740991,-9007199254740991]"
    )
    assert loads_strict("[9007199254740991,-9007199254740991]") == [2**53 - 1, -(2**53 - 1)]
    for number in (2**53, -(2**53), 2**53 + 1):
        with pytest.raises(CanonicalError, match="outside"):
            canonical_json(number)
        with pytest.raises(CanonicalError, match="outside"):
            loads_strict(str(number))


@pytest.mark.parametrize("expected", ["", "00" * 32, "01" + "00" * 31, "xyz", "ab" * 33])
def test_invalid_expected_key_is_a_verdict_not_an_exception(expected):
    signatures = [sign_object(KEY, "job", {"a": 1})]
    verdict = verify_object(signatures, "job", {"a": 1}, expected_public_key=expected)
    assert not verdict.ok
    assert verdict.reason == "wrong_signer"
    assert "expected public key is invalid" in verdict.detail
