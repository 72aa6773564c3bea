"""Config files for long-running commands: a grouped TOML file, then ``STRATA_*`` variables, then flags.

``strata edge run --config edge.toml`` and ``strata device run --config device.toml`` read their frozen config
dataclass from three layers, each overriding the one before, and remember where every value came from::

    dataclass default  <  TOML file (grouped tables)  <  environment (STRATA_EDGE_*)  <  command-line flag

The file holds one table per group (``[broker]``, ``[identity]``, ...) and one key per config field, named as the
field (the flag without its dashes). Relative paths in the file are read relative to the file, so a provisioning
kit can be copied anywhere. Every value of every layer goes through its field's declared kind
(`device._options`): the key ``control_period_s = inf`` in a file, ``STRATA_EDGE_CONTROL_PERIOD_S=inf`` and
``--control-period-s inf`` are refused by the same check, in one line naming the table and key, the variable or
the flag. An unknown table, key or variable, or a missing required value, is a `ConfigError` naming the fix. Only
the standard library is used (``tomllib``).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from device._errors import ConfigError
from device._kinds import MAX_CONFIG_BYTES
from device._names import shown
from device._options import Kind, Refused, field_kind, is_path_kind, read_bounded, refusal

T = TypeVar("T")


@dataclass(frozen=True)
class ConfigLayout:
    """How one config dataclass is laid out in a file and in the environment.

    Every field's kind is its declaration (`device._options.field_kind`); a path kind makes a relative path in the
    file relative to the file.

    Args:
        cls: The frozen config dataclass.
        groups: Table name -> the fields it holds; every init field is in exactly one table.
        env_prefix: Prefix of the environment variables (``STRATA_EDGE_`` -> ``STRATA_EDGE_NODE_ID``).
    """

    cls: type
    groups: Mapping[str, tuple[str, ...]]
    env_prefix: str

    def __post_init__(self) -> None:
        fields = [f.name for f in dataclasses.fields(self.cls) if f.init]
        placed = [name for names in self.groups.values() for name in names]
        missing = sorted(set(fields) - set(placed))
        extra = sorted(set(placed) - set(fields))
        twice = sorted({n for n in placed if placed.count(n) > 1})
        undeclared = sorted(n for n in fields if self.kind(n) is None)
        if missing or extra or twice or undeclared:
            raise ConfigError(f"ConfigLayout of {self.cls.__name__}: fields in no table {missing}, unknown "
                              f"fields {extra}, fields in two tables {twice}, fields without a kind {undeclared}")

    def kind(self, name: str) -> Kind | None:
        """The declared kind of field `name`."""
        f = next(f for f in dataclasses.fields(self.cls) if f.name == name)
        return field_kind(self.cls, f)

    @property
    def paths(self) -> frozenset[str]:
        """The fields that hold paths."""
        return frozenset(n for names in self.groups.values() for n in names if is_path_kind(self._kind(n)))

    def _kind(self, name: str) -> Kind:
        kind = self.kind(name)
        assert kind is not None  # __post_init__ refused undeclared fields
        return kind

    def group_of(self, name: str) -> str:
        """The table that holds field `name`."""
        return next(group for group, names in self.groups.items() if name in names)

    def env_name(self, name: str) -> str:
        """The environment variable of field `name`."""
        return self.env_prefix + name.upper()


@dataclass(frozen=True)
class Layered(Generic[T]):
    """A config built from layers, with where each value came from."""

    config: T
    """The merged, validated config."""
    sources: dict[str, str]
    """Field -> ``default``, ``file PATH``, ``env NAME`` or ``flag --name``."""


def read_config_file(layout: ConfigLayout, path: Path) -> dict[str, Any]:
    """The fields set in the TOML file at `path` (validated; relative paths made relative to the file)."""
    data = read_bounded(path, max_bytes=MAX_CONFIG_BYTES, what="config file")
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {shown(str(path))} is not valid TOML: {shown(str(exc), 200)}; fix "
                          "the file (`strata edge config show` prints a valid one)") from None
    values: dict[str, Any] = {}
    for group, table in raw.items():
        if group not in layout.groups:
            raise ConfigError(f"config file {shown(str(path))}: unknown table [{shown(group)[1:-1]}]; the "
                              f"tables are {', '.join(f'[{g}]' for g in layout.groups)}")
        if not isinstance(table, dict):
            raise ConfigError(f"config file {shown(str(path))}: {shown(group)[1:-1]} must be a table ([{group}] "
                              "with keys under it)")
        for key, value in table.items():
            if key not in layout.groups[group]:
                where = [g for g, names in layout.groups.items() if key in names]
                fix = (f"it belongs in [{where[0]}]" if where
                       else f"the keys of [{group}] are {', '.join(layout.groups[group])}")
                raise ConfigError(f"config file {shown(str(path))}: unknown key {group}.{shown(key)[1:-1]}; "
                                  f"{fix}")
            kind = layout._kind(key)
            if is_path_kind(kind):
                value = _relative_to(path.parent, value)
            try:
                values[key] = kind.coerce(value)
            except Refused as exc:
                raise refusal(f"config file {shown(str(path))}: [{group}] {key} =", value, str(exc)) from None
    return values


def _relative_to(base: Path, value: Any) -> Any:
    """A path (or a list of paths) from a file, relative to the file's folder; other values as they are."""
    if isinstance(value, list | tuple):
        return [_relative_to(base, v) for v in value]
    if not isinstance(value, str) or not value or "\x00" in value:
        return value  # the kind refuses it, naming the value as written
    p = Path(os.path.expanduser(value))
    return str(p if p.is_absolute() else (base / p))


def read_environment(layout: ConfigLayout, environ: Mapping[str, str]) -> dict[str, Any]:
    """The fields set by ``{env_prefix}FIELD`` variables; a variable with the prefix but no field is an error."""
    names = {layout.env_name(f.name): f.name for f in dataclasses.fields(layout.cls) if f.init}
    values: dict[str, Any] = {}
    for var, text in environ.items():
        if not var.startswith(layout.env_prefix):
            continue
        if var not in names:
            raise ConfigError(f"unknown environment variable {shown(var)[1:-1]}; the variables are "
                              f"{layout.env_prefix}<KEY> for the keys of the config file (e.g. {next(iter(names))})")
        name = names[var]
        try:
            values[name] = layout._kind(name).parse(text)
        except Refused as exc:
            raise refusal(var, text, str(exc)) from None
    return values


def load_layered(layout: ConfigLayout, *, file: Path | None, environ: Mapping[str, str],
                 flags: Mapping[str, Any]) -> Layered[Any]:
    """Merge default < file < environment < flags into `layout.cls`, remembering each value's source.

    Args:
        layout: The config's tables, environment prefix and path fields.
        file: The TOML file, or None.
        environ: The environment (``os.environ``).
        flags: Field -> value for the flags given on the command line (None values are "not given").
    """
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    layers: list[tuple[str, dict[str, Any]]] = []
    if file is not None:
        layers.append((f"file {file}", read_config_file(layout, file)))
    layers.append(("env", read_environment(layout, environ)))
    layers.append(("flag", {k: (tuple(v) if isinstance(v, list) else v) for k, v in flags.items() if v is not None}))
    for label, layer in layers:
        for name, value in layer.items():
            values[name] = value
            sources[name] = (f"env {layout.env_name(name)}" if label == "env"
                             else f"flag --{name.replace('_', '-')}" if label == "flag" else label)
    missing = [f.name for f in dataclasses.fields(layout.cls)
               if f.init and f.name not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        name = missing[0]
        raise ConfigError(f"{layout.group_of(name)}.{name} is required: set it in the config file "
                          f"(--config), in {layout.env_name(name)} or with --{name.replace('_', '-')}")
    try:
        config = layout.cls(**values)
    except TypeError as exc:
        raise ConfigError(shown(str(exc), 200)) from None
    for f in dataclasses.fields(layout.cls):
        if f.init:
            sources.setdefault(f.name, "default")
    return Layered(config=config, sources=sources)


def format_layered(layout: ConfigLayout, layered: Layered[Any]) -> str:
    """The merged config as TOML, each value followed by a comment saying where it came from."""
    lines: list[str] = []
    for group, names in layout.groups.items():
        lines.append(f"[{group}]")
        for name in names:
            value = getattr(layered.config, name)
            entry = f"# {name} (unset)" if value is None else f"{name} = {_toml_value(value)}"
            lines.append(f"{entry:<48}  # {layered.sources[name]}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def toml_tables(tables: Mapping[str, Mapping[str, Any]]) -> str:
    """TOML text of ``{table: {key: value}}`` (strings, numbers, booleans, lists); None values are left out."""
    lines: list[str] = []
    for group, table in tables.items():
        present = [(k, v) for k, v in table.items() if v is not None]
        if not present:
            continue
        lines.append(f"[{group}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in present)
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def to_toml(layout: ConfigLayout, values: Mapping[str, Any]) -> str:
    """A config file for `values` (field -> value), grouped by `layout`'s tables; None values are left out."""
    return toml_tables({group: {n: values.get(n) for n in names} for group, names in layout.groups.items()})


def write_kit(folder: Path, files: Mapping[str, bytes]) -> tuple[str, ...]:
    """Write a provisioning kit: `folder` (0700) holding `files` (0600 each, replaced atomically).

    A kit is what one node or device needs to run: its config file, its own credentials and the trusted key,
    nothing of another's. Returns the file names, sorted.
    """
    from device._atomic import write_atomic

    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(folder, 0o700)
        for name, data in files.items():
            write_atomic(folder / name, data, mode=0o600)
    except OSError as exc:
        raise ConfigError(f"cannot write the kit {folder}: {exc.strerror or exc}; choose a writable folder") from None
    return tuple(sorted(files))
