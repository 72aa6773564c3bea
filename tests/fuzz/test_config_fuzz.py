"""The fuzz harness over config files and variables: hostile TOML keys and STRATA_EDGE_*/STRATA_DEVICE_* values.

Every key of `edge.toml` and `device.toml` (and every variable) goes through the field's declared kind, as the
flag does. `strata edge config check` / `strata device config check` run to their end (they read only);
`edge run` / `device run` run their check, which is the same function. The keys come from the layouts
themselves, so a new config field is fuzzed the day it is added.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from device._config_file import ConfigLayout
from tests.fuzz import _harness, _values

QUICK = _harness.quick(40)
LONG = _harness.long(400)


def _layouts() -> dict[str, ConfigLayout]:
    from device._cli import _device_layout
    from edge._provision import EDGE_LAYOUT

    return {"edge": EDGE_LAYOUT, "device": _device_layout()}


TIERS = {
    "edge": ("edge-config", [["edge", "config", "check"], ["edge", "run"]]),
    "device": ("device-config", [["device", "config", "check"], ["device", "run", "--env", "CartPole-v1"]]),
}


def toml_literal(value: Any) -> str:
    """`value` written as a TOML value (strings escaped as JSON does, which TOML's basic strings read)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return ("nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")) if not math.isfinite(value) \
            else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value))


_SCALARS = st.one_of(st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(), st.booleans(),
                     st.text(max_size=30))
TOML_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                              st.dictionaries(st.text(max_size=5), inner, max_size=2)),
                           max_leaves=5)


@st.composite
def config_case(draw: st.DrawFn, tier: str,
                places: _values.Places) -> tuple[list[str], dict[str, bytes], dict[str, str]]:
    """``(argv, files, environment)``: the tier's config file with one key (or a variable) given a hostile value."""
    layout = _layouts()[tier]
    content, commands = TIERS[tier]
    argv = draw(st.sampled_from(commands))
    config = places.fixture(content)
    assert config is not None
    text = config.read_text()
    group = draw(st.sampled_from([*layout.groups, "unknown"]))
    names = layout.groups.get(group, ("key",))
    key = draw(st.one_of(st.sampled_from(names), st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,9}", fullmatch=True)))
    kind = layout.kind(key) if key in sum(layout.groups.values(), ()) else None
    hostile = [v for _, v in _values.hostile(kind.describe(), places)] if kind is not None else []
    via = draw(st.sampled_from(["file", "environment"]))
    if via == "environment":
        value = draw(st.one_of(st.sampled_from(hostile or ["x"]), st.text(max_size=30))
                     .filter(lambda v: "\x00" not in v))
        variable = layout.env_name(key) if kind else f"{layout.env_prefix}{key}"
        return [*argv, "--config", str(config)], {}, {variable: value}
    literal = draw(st.one_of(TOML_VALUES.map(toml_literal), st.sampled_from(hostile or ['""']).map(toml_literal),
                             st.sampled_from(["nan", "inf", "-inf", "1e400", "[", '"unterminated', "9" * 30])))
    lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} =")]
    if f"[{group}]" in lines:
        lines.insert(lines.index(f"[{group}]") + 1, f"{json.dumps(key)} = {literal}")
    else:
        lines += [f"[{group}]", f"{json.dumps(key)} = {literal}"]
    # Relative paths in the file are read relative to it: keep the fixture's absolute ones, write it in the sandbox.
    return [*argv, "--config", "case.toml"], {"case.toml": "\n".join(lines).encode(errors="surrogatepass")}, {}


def _fuzz(tier: str, places: _values.Places, data: st.DataObject) -> None:
    argv, files, env = data.draw(config_case(tier, places), label="case")
    name = " ".join(w for w in argv[:3] if not w.startswith("-") and w != "CartPole-v1")
    command = next(c for c in _harness.commands() if c.name == name)
    check_only = name not in _harness.FULL
    outcome = _harness.run_case(argv, places, check_only=check_only, env=env, files=files)
    _harness.check_outcome(command, argv, outcome, places, check_only=check_only)


@pytest.mark.parametrize("tier", sorted(TIERS))
@QUICK
@given(data=st.data())
def test_config_files_and_variables_refuse_hostile_values_in_one_line(tier: str, places: _values.Places,
                                                                      data: st.DataObject) -> None:
    _fuzz(tier, places, data)


@pytest.mark.slow
@pytest.mark.parametrize("tier", sorted(TIERS))
@LONG
@given(data=st.data())
def test_config_files_and_variables_refuse_hostile_values_in_one_line_long(tier: str, places: _values.Places,
                                                                           data: st.DataObject) -> None:
    _fuzz(tier, places, data)


@pytest.mark.parametrize(("line", "variable", "flag"), [
    ("[simulator]\ncontrol_period_s = inf", "STRATA_EDGE_CONTROL_PERIOD_S", "--control-period-s"),
    ("[simulator]\nduration = nan", "STRATA_EDGE_DURATION", "--duration"),
    ("[simulator]\nsteps = -1", "STRATA_EDGE_STEPS", "--steps"),
])
def test_a_file_key_a_variable_and_a_flag_are_refused_by_the_same_declaration(
        places: _values.Places, line: str, variable: str, flag: str) -> None:
    """The issue's example: ``control_period_s = inf`` passed `edge config check`, then `edge run` overflowed."""
    config = places.fixture("edge-config")
    assert config is not None
    key, value = line.split("\n")[1].split(" = ")
    messages = []
    for argv, files, env in (
            (["edge", "config", "check", "--config", "case.toml"],
             {"case.toml": config.read_text().replace("[simulator]\nsteps = 5\n", line + "\n").encode()}, {}),
            (["edge", "config", "check", "--config", str(config)], {}, {variable: value}),
            (["edge", "config", "check", "--config", str(config), f"{flag}={value}"], {}, {})):
        outcome = _harness.run_case(argv, places, check_only=False, env=env, files=files)
        assert outcome.code == 2, outcome.stdout
        [error] = outcome.stderr.splitlines()
        messages.append(error.split(": ", 2)[2])
    form = messages[2].split(": ", 1)[1].removesuffix(" (see `strata edge config check --help`)")
    assert all(m.endswith(form) for m in messages[:2]), messages
    assert "[simulator] " + key in messages[0] and variable in messages[1]
