"""Declared options -> argparse: every flag of every command is built here from its `device._options` kind.

`add_option` adds one hand-declared option; `add_config_arguments` adds one ``--flag`` per field of a frozen
config dataclass, with the field's declared kind (``dataclasses.field(metadata=...)``, see
`device._options.declared`) and its docstring as help: a config field is documented by a string literal right
under it (as in Acme and CleanRL), read here from the class source, so the documentation lives in one place.

Each argparse action keeps its `Option` (`option_of`), so the fuzz harness and the docs walk the real parser and
see every option's declaration. A refused value is an argparse error (exit 2) of one line:
``--port '70000': must be a whole number of port from 0 to 65535``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from device._errors import ConfigError
from device._names import shown
from device._options import (
    Choice,
    Kind,
    Many,
    Number,
    Refused,
    Seconds,
    Switch,
    field_kind,
    is_path_kind,
)

T = TypeVar("T")

_OPTION_ATTR = "strata_option"


@dataclass(frozen=True)
class Option:
    """One declared option of a command: its name, kind, help and how the flag takes it."""

    name: str
    """The destination (``control_period_s``): the config field, the TOML key, the variable's suffix."""
    kind: Kind
    flags: tuple[str, ...]
    """``("--control-period-s",)``; empty for a positional argument."""
    help: str
    default: Any = None
    required: bool = False
    takes: Literal["one", "words", "repeat"] = "one"
    """How a `Many` kind is given: ``one`` text split at commas, ``words`` several words after the flag, ``repeat``
    the flag once per item."""

    @property
    def where(self) -> str:
        """How messages name it: the flag, or the positional's name."""
        return self.flags[0] if self.flags else self.name.upper()


def option_of(action: argparse.Action) -> Option | None:
    """The declaration behind an argparse action (None for --help and sub-command choosers)."""
    return typing.cast("Option | None", getattr(action, _OPTION_ATTR, None))


def field_docs(cls: type) -> dict[str, str]:
    """Return ``{field name: docstring}`` for the string literals placed under a dataclass's fields."""
    return dict(_field_docs(cls))


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    # Parsing a class's source costs ~15 ms; every `strata` command builds the whole parser, so once per class.
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        stmts = body.body
        for stmt, nxt in itertools.pairwise(stmts):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


class _Declared(argparse.Action):
    """Parses and checks a flag's text with its declared kind; a refusal is an argparse error naming the flag."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, option: Option, as_path: bool,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.option = option
        self.as_path = as_path

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        kind = self.option.kind
        try:
            if self.option.takes == "words":
                assert isinstance(kind, Many) and isinstance(values, list)
                items = [self._parse_item(kind.item, text) for text in values]
                value: Any = list(self._checked(kind, tuple(items), " ".join(values)))
            elif self.option.takes == "repeat":
                assert isinstance(kind, Many) and isinstance(values, str)
                before = list(getattr(namespace, self.dest, None) or [])
                value = list(self._checked(kind, (*before, self._parse_item(kind.item, values)), values))
            else:
                assert isinstance(values, str)
                value = self._parsed(kind, values)
        except Refused as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        setattr(namespace, self.dest, self._paths(value))

    def _parse_item(self, kind: Kind, text: str) -> Any:
        return self._parsed(kind, text)

    @staticmethod
    def _parsed(kind: Kind, text: str) -> Any:
        try:
            return kind.parse(text)
        except Refused as exc:
            raise Refused(f"{shown(text)}: {exc}") from None

    @staticmethod
    def _checked(kind: Many, items: tuple[Any, ...], text: str) -> tuple[Any, ...]:
        try:
            return kind.check(items)
        except Refused as exc:
            raise Refused(f"{shown(text)}: {exc}") from None

    def _paths(self, value: Any) -> Any:
        if not self.as_path or not is_path_kind(self.option.kind):
            return value
        if isinstance(value, list):
            return [Path(v) for v in value]
        return Path(value)


def _help(text: str, kind: Kind, default: Any) -> str:
    parts = []
    if not isinstance(kind, Switch | Choice):
        parts.append(kind.form)
    if default is not None and "default" not in text:
        shown_default = " ".join(map(str, default)) if isinstance(default, tuple | list) else default
        parts.append(f"default: {shown_default}")
    tail = f" ({'; '.join(parts)})" if parts else ""
    return (text + tail).replace("%", "%%")


def add_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, kind: Kind, *, help: str,
               default: Any = None, required: bool = False, takes: Literal["one", "words", "repeat"] = "one",
               metavar: str | None = None, dest: str | None = None, as_path: bool = True,
               documented_default: Any = None) -> Option:
    """Declare one option of a command: ``--name`` (or a positional ``name``) of `kind`.

    Args:
        parser: The command's parser (or an argument group of it).
        name: ``--flag-name`` for an option, ``name`` for a positional argument.
        kind: What it accepts (`device._options`).
        help: What it is for; the accepted form and the default are appended.
        default: The value when it is not given (None: not given).
        required: The option must be given.
        takes: For a `Many` kind: ``one`` comma-separated text, ``words`` several words, ``repeat`` the flag once
            per item.
        metavar: The placeholder in the usage line (default: the kind's).
        dest: The namespace attribute (default: from `name`).
        as_path: Give path values as `pathlib.Path` (hand-written commands); config fields keep text.
        documented_default: The default the help shows when `default` is None (a config field's default, which
            the namespace leaves as None so "not given" stays visible).
    """
    positional = not name.startswith("-")
    dest = dest or name.lstrip("-").replace("-", "_")
    shown_default = default if documented_default is None else documented_default
    option = Option(name=dest, kind=kind, flags=() if positional else (name,), help=help, default=shown_default,
                    required=required, takes=takes)
    text = _help(help, kind, shown_default)
    action: argparse.Action
    if isinstance(kind, Switch):
        if default is None:  # a config field: --x / --no-x, None when neither is given
            action = parser.add_argument(name, dest=dest, action=argparse.BooleanOptionalAction, default=None,
                                         help=text)
        else:
            action = parser.add_argument(name, dest=dest, action="store_true", default=bool(default), help=text)
    else:
        item = kind.item if isinstance(kind, Many) else kind
        shape = item.choices_metavar if isinstance(item, Choice) else item.metavar
        kwargs: dict[str, Any] = {"action": _Declared, "option": option, "as_path": as_path, "default": default,
                                  "help": text, "metavar": metavar or shape}
        if takes == "words":
            kwargs["nargs"] = "+"
        if positional:
            action = parser.add_argument(name, **kwargs)
            if dest != name:
                action.dest = dest
        else:
            action = parser.add_argument(name, dest=dest, required=required, **kwargs)
    setattr(action, _OPTION_ATTR, option)
    return option


def add_config_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    skip: typing.Collection[str] = (),
) -> None:
    """Add one ``--flag`` per field of the dataclass `cls`, with its declared kind and its docstring as help.

    Defaults are left as ``None`` in the namespace so `config_from_args` can tell "not given" from "given"; the
    help text shows the dataclass default.

    Raises:
        ConfigError: A field has no declared kind (every option is declared: `device._options.declared`).
    """
    docs = _field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        kind = field_kind(cls, f)
        if kind is None:
            raise ConfigError(f"{cls.__name__}.{f.name} has no declared kind; declare it with "
                              "device._options.declared(KIND, default)")
        default = f.default if f.default is not dataclasses.MISSING else None
        takes: Literal["one", "words"] = "words" if typing.get_origin(hints[f.name]) is tuple else "one"
        add_option(parser, "--" + f.name.replace("_", "-"), kind, help=docs.get(f.name, ""), default=None,
                   takes=takes, dest=f.name, as_path=False, documented_default=default)


def config_from_args(cls: type[T], namespace: argparse.Namespace, **overrides: Any) -> T:
    """Build `cls` from the flags that were given on the command line, plus `overrides`."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value = getattr(namespace, f.name, None)
        if value is not None:
            values[f.name] = tuple(value) if isinstance(value, list) else value
    values.update(overrides)
    return cls(**values)


def config_from_dict(cls: type[T], values: dict[str, Any]) -> T:
    """Build `cls` from the JSON-ready values its ``to_dict`` wrote (lists become tuples); unknown keys are an error.

    Raises:
        ConfigError: `values` names a field `cls` does not have (a checkpoint from another version, a typo), or a
            value its declaration refuses.
    """
    if not isinstance(values, dict):
        raise ConfigError(f"{cls.__name__}.from_dict: expected a table of fields, got {type(values).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"{cls.__name__}.from_dict: unknown fields {shown(unknown)}; known: {sorted(names)}")
    try:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
    except TypeError as exc:  # a wrong type a field's own check trips over
        raise ConfigError(f"{cls.__name__}.from_dict: {shown(str(exc), 160)}") from None


def finite_float(text: str) -> float:
    """A finite number (the `device._options.Number` kind as an argparse ``type``)."""
    try:
        return Number().parse(text)
    except Refused as exc:
        raise argparse.ArgumentTypeError(f"{shown(text)}: {exc}") from None


def seconds(text: str) -> float:
    """A number of seconds, 0 or more (the `device._options.Seconds` kind as an argparse ``type``)."""
    try:
        return Seconds().parse(text)
    except Refused as exc:
        raise argparse.ArgumentTypeError(f"{shown(text)}: {exc}") from None


def command(parser: argparse.ArgumentParser, *, check: Callable[[argparse.Namespace], T],
            run: Callable[[argparse.Namespace, T], int | None]) -> None:
    """Make `parser` a command: `check` validates everything before any work and returns what `run` needs.

    ``strata`` calls ``run(args, check(args))``; ``config check`` commands and the fuzz harness call the check
    alone, so what they validate is exactly what the command validates before it starts.
    """
    parser.set_defaults(check=check, func=run)


def no_check(args: argparse.Namespace) -> None:
    """The check of a command whose options are all checked by their declarations and that has nothing more."""
    return None
