"""config.toml: what ``hero-node init`` writes loads back as the same NodeConfig, whatever the
values, and a wrong setting is refused with a ConfigError that names it."""

import os
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.config import (
    LINK_ENCRYPTION,
    LOWER_BOUNDS,
    UPPER_BOUNDS,
    NodeConfig,
    load_config,
    render_config,
)
from node.errors import ConfigError
from node.host.home import init_home
from node.sandbox.plan import MODES

_BY_TYPE = {
    "int": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "float": st.floats(allow_nan=False, allow_infinity=False),
    "str": st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
    "bool": st.booleans(),
}
# every scalar field of NodeConfig, whatever fields it grows (home and the tables aside)
_SCALARS = {f.name: _BY_TYPE[str(f.type)] for f in fields(NodeConfig) if str(f.type) in _BY_TYPE}
# settings with a lower bound are drawn above it (a value below is refused: test_type_breaker.py)
# (drawn in range, not filtered: with a dozen bounded settings a filter rejects most draws)
_TYPES = {f.name: str(f.type) for f in fields(NodeConfig)}
_SCALARS |= {
    n: st.integers(int(low), 2**63 - 1)
    if _TYPES[n] == "int"
    else st.floats(float(low), allow_nan=False, allow_infinity=False)
    for n, low in LOWER_BOUNDS.items()
}
_SCALARS |= {
    n: st.integers(int(LOWER_BOUNDS.get(n, 0)), int(high)) for n, high in UPPER_BOUNDS.items()
}
_SCALARS["isolation"] = st.sampled_from(MODES)  # any other value is refused
_SCALARS["link_encryption"] = st.sampled_from(LINK_ENCRYPTION)  # likewise

_TYPE_NAME = st.from_regex(r"\A[A-Za-z0-9_.-]{1,12}\Z")
_ARG = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1).filter(
    lambda a: "{" not in a and "}" not in a  # placeholders are checked: see test_runners.py
)


@st.composite
def _tables(draw: st.DrawFn) -> dict[str, object]:
    extra = set(draw(st.lists(_TYPE_NAME, max_size=3, unique=True))) - {"python", "sh"}
    runners = {t: draw(st.integers(0, 64)) for t in ("python", "sh", *sorted(extra))}
    commands = {t: draw(st.lists(_ARG, min_size=1, max_size=3)) for t in sorted(extra)}
    groups = draw(st.dictionaries(st.sampled_from(sorted(runners)), _TYPE_NAME, max_size=2))
    return {"runners": runners, "commands": commands, "runner_groups": groups}


def test_the_property_covers_every_setting() -> None:
    assert {"name", "redis_url", "grace_s", "link_encryption", "lease_ttl_ms"} <= set(_SCALARS)


@settings(max_examples=150, deadline=None)
@given(values=st.fixed_dictionaries(_SCALARS), tables=_tables())
def test_rendered_config_loads_back_unchanged(
    tmp_path_factory: pytest.TempPathFactory, values: dict[str, object], tables: dict[str, object]
) -> None:
    home = tmp_path_factory.mktemp("home")
    cfg = NodeConfig(home=home, **values, **tables)  # type: ignore[arg-type]
    (home / "config.toml").write_text(render_config(cfg), encoding="utf-8")
    assert load_config(home) == cfg


def test_init_writes_a_config_that_loads_back(tmp_path: Path) -> None:
    cfg = init_home(tmp_path / "n", name='quo"te \\ é', runners={"python": 3}, grace_s=2.5)
    assert load_config(cfg.home) == cfg
    assert cfg.name == 'quo"te \\ é'


def test_init_gives_python_one_slot_per_core_it_may_run_on(tmp_path: Path) -> None:
    """More python slots than cores run no more jobs at once and split a stream of jobs into
    lone ones (bench/HISTORY.md#slots-per-core): a node's default is one per core, counted
    from the CPUs the process may use, in a process held to one CPU and in this one."""
    code = (
        "import os, sys\nfrom pathlib import Path\n"
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from node.host.home import init_home\n"
        "print(init_home(Path(sys.argv[1])).runners['python'])\n"
    )
    one = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "one")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert one.stdout.strip() == "1"
    assert load_config(tmp_path / "one").runners["python"] == 1  # written, not implied
    here = init_home(tmp_path / "here").runners["python"]
    assert here == min(len(os.sched_getaffinity(0)), 8)


def _write(home: Path, text: str) -> None:
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(text, encoding="utf-8")


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ('listen_port = "7700"', r"\[node\] listen_port has the wrong type \('7700'\)"),
        ("listen_port = true", r"\[node\] listen_port has the wrong type \(True\)"),
        ('grace_s = "10"', r"\[node\] grace_s has the wrong type"),
        ("name = 3", r"\[node\] name has the wrong type \(3\)"),
        ('tls = "yes"', r"\[node\] tls has the wrong type"),
        ('home = "/x"\ncolour = 1', r"unknown \[node\] setting\(s\): colour, home"),
    ],
)
def test_a_wrong_setting_is_named(tmp_path: Path, node: str, message: str) -> None:
    _write(tmp_path, f"[node]\n{node}\n")
    with pytest.raises(ConfigError, match=message):
        load_config(tmp_path)


@pytest.mark.parametrize("runners", ["python = -1", 'python = "2"', "python = true"])
def test_a_wrong_concurrency_is_refused(tmp_path: Path, runners: str) -> None:
    _write(tmp_path, f"[runners]\n{runners}\n")
    with pytest.raises(ConfigError, match=r"\[runners\] maps a script type to a concurrency"):
        load_config(tmp_path)


def test_missing_or_broken_files_say_how_to_fix_them(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="create one with: hero-node init"):
        load_config(tmp_path)
    _write(tmp_path, "[node\n")
    with pytest.raises(ConfigError, match="config.toml"):
        load_config(tmp_path)


def test_an_int_serves_as_a_float_and_defaults_fill_the_rest(tmp_path: Path) -> None:
    _write(tmp_path, "[node]\ngrace_s = 3\n")
    assert load_config(tmp_path) == replace(NodeConfig(home=tmp_path), grace_s=3.0)
