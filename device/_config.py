"""Frozen config dataclasses <-> argparse: field docstrings become `--help` text.

A config field is documented by a string literal right under it (as in Acme and CleanRL); this
module reads those strings from the class source, so the documentation lives in one place.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import itertools
import math
import textwrap
import types
import typing
from typing import Any, Literal, TypeVar, get_args, get_origin

from device._errors import ConfigError

T = TypeVar("T")


def field_docs(cls: type) -> dict[str, str]:
    """Return ``{field name: docstring}`` for the string literals placed under a dataclass's fields."""
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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def finite_float(text: str) -> float:
    """The argparse type of every float field (and of other float flags): a finite number.

    Python's float() takes "nan" and "inf", which no config field means; they would surface only later, as NaN
    weights or an endless wait.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; pass a number such as 0.5")
    return value


def seconds(text: str) -> float:
    """The argparse type of a duration flag: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0; pass one such as 1.0")
    return value


def add_config_arguments(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    skip: typing.Collection[str] = (),
) -> None:
    """Add one ``--flag`` per field of the dataclass `cls`, with its docstring as help.

    Defaults are left as ``None`` in the namespace so `config_from_args` can tell "not given"
    from "given"; the help text shows the dataclass default.
    """
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or not f.init:
            continue
        hint = hints[f.name]
        default = f.default if f.default is not dataclasses.MISSING else None
        help_text = docs.get(f.name, "")
        help_text = f"{help_text} (default: {default})" if help_text else f"(default: {default})"
        help_text = help_text.replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "help": help_text}
        origin = get_origin(hint)
        args = get_args(hint)
        if origin in (types.UnionType, typing.Union):
            non_none = [a for a in args if a is not type(None)]
            hint = non_none[0] if len(non_none) == 1 else str
            origin, args = get_origin(hint), get_args(hint)
        if hint is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif origin is Literal:
            kwargs["choices"] = list(args)
            kwargs["type"] = type(args[0])
        elif origin is tuple:
            kwargs["nargs"] = "+"
            kwargs["type"] = args[0]
            kwargs["metavar"] = args[0].__name__.upper()
        elif hint in (int, float, str):
            kwargs["type"] = finite_float if hint is float else hint
            kwargs["metavar"] = hint.__name__.upper()
        else:
            kwargs["type"] = str
        parser.add_argument(_flag(f.name), **kwargs)


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
        ConfigError: `values` names a field `cls` does not have (a checkpoint from another version, a typo).
    """
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"{cls.__name__}.from_dict: unknown fields {unknown}; known: {sorted(names)}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
