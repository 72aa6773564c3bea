"""The one identifier rule and the path guard every command uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from device import ConfigError, identifier, inside, is_identifier, shown


@pytest.mark.parametrize("name", ["n1", "node-1", "node_1", "Node1", "a.b", "x" * 64, "0"])
def test_identifiers_that_follow_the_rule(name: str) -> None:
    assert identifier(name, what="--node") == name


@pytest.mark.parametrize("name", ["", ".", "..", "-a", "_a", ".hidden", "a/b", "a+b", "a#", "x" * 65, "a b", "é",
                                  "a\n", None, 3])
def test_identifiers_that_do_not(name: object) -> None:
    assert not is_identifier(name)
    with pytest.raises(ConfigError, match=re.escape("--node must be 1-64 letters, digits")):
        identifier(name, what="--node")


def test_a_huge_value_is_quoted_short() -> None:
    with pytest.raises(ConfigError) as info:
        identifier("x" * 10_000_000, what="--node")
    assert len(str(info.value)) < 200
    assert shown("y" * 100).endswith("...") and len(shown("y" * 100)) == 80


def test_paths_stay_inside_their_root(tmp_path: Path) -> None:
    assert inside(tmp_path, "n1", "edge.toml", what="node") == tmp_path.resolve() / "n1" / "edge.toml"
    for parts in [("..",), (".",), ("a", "..", ".."), ("/etc",), ("",)]:
        with pytest.raises(ConfigError, match="leads outside"):
            inside(tmp_path, *parts, what="node")


def test_a_link_out_of_the_root_is_refused(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "escape").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="leads outside"):
        inside(tmp_path / "root", "escape", "x", what="node")
