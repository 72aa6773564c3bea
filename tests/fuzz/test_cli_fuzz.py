"""The fuzz harness over every `strata` command (issue 33): hostile argv, TOML keys, variables and damaged files.

Generated from the parser's own declarations (`tests.fuzz._harness`), so an option is fuzzed the day it is added.
The default run is a quick, derandomized profile (well under two minutes); ``-m slow`` runs the long one with
fresh random examples. Which commands run to their end and which run their check only: `_harness.FULL`.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz import _harness, _values

COMMANDS = _harness.commands()
QUICK = _harness.quick(12)
LONG = _harness.long(300)


def test_every_option_of_every_command_is_declared() -> None:
    undeclared = {c.name: c.undeclared for c in COMMANDS if c.undeclared}
    assert not undeclared, f"options without a declaration (device._config.add_option): {undeclared}"
    assert len(COMMANDS) >= 28


def _fuzz(command: _harness.Command, places: _values.Places, data: st.DataObject) -> None:
    argv = data.draw(_harness.argv_strategy(command, places), label="argv")
    check_only = command.name not in _harness.FULL
    env = _harness.AWS_ENV if command.name.startswith("infra") else {}
    outcome = _harness.run_case(argv, places, check_only=check_only, env=env)
    _harness.check_outcome(command, argv, outcome, places, check_only=check_only)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name.replace(" ", "-"))
@QUICK
@given(data=st.data())
def test_every_command_refuses_hostile_argv_in_one_line(command: _harness.Command, places: _values.Places,
                                                        data: st.DataObject) -> None:
    _fuzz(command, places, data)


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name.replace(" ", "-"))
@LONG
@given(data=st.data())
def test_every_command_refuses_hostile_argv_in_one_line_long(command: _harness.Command, places: _values.Places,
                                                             data: st.DataObject) -> None:
    _fuzz(command, places, data)
