"""One declaration per option: its kind (type, unit, range, path kind, URL form), shared by flag, file and variable.

Every option of every `strata` command is declared once, as a `Kind`: an integer or number with its unit and
bounds, text, an identifier, a choice, a switch, a path of a stated kind, a URL with its schemes, a host, a port,
or a list of one of these. The argparse flag (`device._config.add_option`), the TOML key and the ``STRATA_*``
variable (`device._config_file`) and a config dataclass's own check (`check_fields`) all call the same
``parse`` / ``coerce`` / ``check`` of that kind, so a value refused on the command line is refused from a file too.

A kind refuses a value with `Refused`, whose text is the problem alone (``must be an integer from 0 to
65535``); the caller names where the value came from (``--port``, ``edge.toml: [broker] port``,
``STRATA_EDGE_PORT``) and quotes the value cut to 80 characters (`device._names.shown`), so every refusal is
one line: where, what, and the accepted form.

Path kinds check what a path is before anything opens it:

    InputFile     an existing regular file we may read (never a folder, /dev/zero or a pipe), size-capped
    InputFolder   an existing folder
    OutputFile    a file to write: not a folder, and its folder exists (no parent is created)
    OutputFolder  a folder to create or reuse: its parent exists, unless ``parents=True`` says otherwise

Our own files read back (checkpoints, metrics, caches, kits, state) go through `read_bounded`, which reads at
most the declared cap and turns every OS error into one line naming the file.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import stat
import types
import typing
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from device._errors import ConfigError
from device._names import HOST_FORM, IDENTIFIER_FORM, is_host, is_identifier, shown

OPTION_KEY = "strata.kind"
"""Key of a dataclass field's `Kind` in its ``metadata``."""

_INTEGER = re.compile(r"[+-]?[0-9]{1,30}", re.ASCII)
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
PATH_MAX = 4095
NAME_MAX = 255


class Refused(Exception):
    """A value a kind does not accept; the text is the problem and the accepted form (``must be ...``)."""


def refusal(where: str, value: object, problem: str) -> ConfigError:
    """The one-line error for `value` given at `where`: ``WHERE 'VALUE': PROBLEM`` (the value cut to 80 chars)."""
    return ConfigError(f"{where} {shown(value)}: {problem}")


def _between(lo: float | None, hi: float | None, *, lo_open: bool = False, hi_open: bool = False) -> str:
    def num(x: float) -> str:
        return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)

    if lo is not None and hi is not None:
        if not lo_open and not hi_open:
            return f"from {num(lo)} to {num(hi)}"
        low = f"above {num(lo)}" if lo_open else f"at least {num(lo)}"
        high = f"below {num(hi)}" if hi_open else f"at most {num(hi)}"
        return f"{low} and {high}"
    if lo is not None:
        return f"above {num(lo)}" if lo_open else f"of at least {num(lo)}"
    if hi is not None:
        return f"below {num(hi)}" if hi_open else f"of at most {num(hi)}"
    return ""


@dataclass(frozen=True)
class Kind:
    """What an option accepts. Subclasses override `check`, and `parse`/`coerce` when text or TOML needs work."""

    metavar: ClassVar[str] = "VALUE"

    @property
    def form(self) -> str:
        """The accepted form, for messages and help (``an integer from 0 to 65535``)."""
        return "a value"

    def problem(self) -> str:
        """The refusal text: ``must be FORM``."""
        return f"must be {self.form}"

    def parse(self, text: str) -> Any:
        """A flag's or an environment variable's text as a checked value; raise `Refused`."""
        return self.check(text)

    def coerce(self, value: Any) -> Any:
        """A TOML (or JSON) value as a checked value; raise `Refused`."""
        if not isinstance(value, str):
            raise Refused(self.problem())
        return self.parse(value)

    def check(self, value: Any) -> Any:
        """Return `value` if it is acceptable, else raise `Refused`."""
        return value

    def check_form(self, value: Any) -> Any:
        """`check` without looking outside the value (no file system, no registry): a config's own check."""
        return self.check(value)

    def describe(self) -> dict[str, Any]:
        """The declaration as plain values (the fuzz harness builds its hostile values from this)."""
        out: dict[str, Any] = {"kind": type(self).__name__}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.describe() if isinstance(value, Kind) else value
        return out


# ------------------------------------------------------------------------------------------------ numbers


@dataclass(frozen=True)
class Integer(Kind):
    """A whole number within inclusive bounds; `unit` names what it counts (``bytes``, ``seconds``)."""

    min: int | None = None
    max: int | None = None
    unit: str = ""
    noun: str = ""
    """What it is, when not a count of `unit` (``a TCP port``)."""
    metavar: ClassVar[str] = "N"

    @property
    def form(self) -> str:
        what = self.noun or (f"a whole number of {self.unit}" if self.unit else "an integer")
        return f"{what} {_between(self.min, self.max)}".strip()

    def parse(self, text: str) -> int:
        if not _INTEGER.fullmatch(text.strip()):
            raise Refused(self.problem())
        return self.check(int(text.strip()))

    def coerce(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Refused(self.problem())
        return self.check(value)

    def check(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise Refused(self.problem())
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            raise Refused(self.problem())
        return value


@dataclass(frozen=True)
class Number(Kind):
    """A finite number within bounds (each inclusive unless `min_open`/`max_open`); NaN and infinities never."""

    min: float | None = None
    max: float | None = None
    min_open: bool = False
    max_open: bool = False
    unit: str = ""
    metavar: ClassVar[str] = "X"

    @property
    def form(self) -> str:
        what = f"a finite number of {self.unit}" if self.unit else "a finite number"
        return f"{what} {_between(self.min, self.max, lo_open=self.min_open, hi_open=self.max_open)}".strip()

    def parse(self, text: str) -> float:
        if len(text) > 64 or not _NUMBER.fullmatch(text.strip()):
            raise Refused(self.problem())
        return self.check(float(text.strip()))

    def coerce(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Refused(self.problem())
        return self.check(float(value))

    def check(self, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Refused(self.problem())
        value = float(value)
        if not math.isfinite(value):
            raise Refused(self.problem())
        if self.min is not None and (value <= self.min if self.min_open else value < self.min):
            raise Refused(self.problem())
        if self.max is not None and (value >= self.max if self.max_open else value > self.max):
            raise Refused(self.problem())
        return typing.cast(float, value)


def Seconds(max: float | None = None, *, positive: bool = False) -> Number:
    """A duration: a finite number of seconds, 0 or more (above 0 with `positive`), at most `max`."""
    return Number(min=0.0, max=max, min_open=positive, unit="seconds")


def Port(*, zero: bool = True) -> Integer:
    """A TCP port: 1-65535, or 0 (a free one) when `zero`."""
    return Integer(min=0 if zero else 1, max=65535, unit="port", noun="a TCP port")


# ------------------------------------------------------------------------------------------------ text


def _one_line(value: Any, kind: Kind, max_chars: int) -> str:
    if not isinstance(value, str) or len(value) > max_chars or _CONTROL.search(value):
        raise Refused(kind.problem())
    return value


@dataclass(frozen=True)
class Text(Kind):
    """One line of text (no control characters), at most `max_chars`; empty only when `empty`."""

    max_chars: int = 256
    empty: bool = False
    what: str = "text"
    metavar: ClassVar[str] = "TEXT"

    @property
    def form(self) -> str:
        least = 0 if self.empty else 1
        return f"{self.what} of {least}-{self.max_chars} characters on one line"

    def check(self, value: Any) -> str:
        value = _one_line(value, self, self.max_chars)
        if not value and not self.empty:
            raise Refused(self.problem())
        return typing.cast(str, value)


@dataclass(frozen=True)
class Matching(Kind):
    """Text that matches `pattern` in full (``form`` says it in words); empty only when `empty`."""

    pattern: str = ""
    words: str = ""
    empty: bool = False
    example: str = ""
    """A value that matches (for the docs and the fuzz harness)."""
    metavar: ClassVar[str] = "TEXT"

    @property
    def form(self) -> str:
        return self.words + (" (or empty)" if self.empty else "")

    def check(self, value: Any) -> str:
        value = _one_line(value, self, 1024)
        if value == "" and self.empty:
            return typing.cast(str, value)
        if not re.fullmatch(self.pattern, value):
            raise Refused(self.problem())
        return typing.cast(str, value)


@dataclass(frozen=True)
class Name(Kind):
    """An identifier (`device._names`): a fleet, node, device, policy or key name."""

    empty: bool = False
    metavar: ClassVar[str] = "NAME"

    @property
    def form(self) -> str:
        return IDENTIFIER_FORM + (" (or empty)" if self.empty else "")

    def check(self, value: Any) -> str:
        if value == "" and self.empty:
            return typing.cast(str, value)
        if not is_identifier(value):
            raise Refused(self.problem())
        return typing.cast(str, value)


@dataclass(frozen=True)
class Choice(Kind):
    """One of `values`, exactly."""

    values: tuple[str, ...] = ()

    @property
    def form(self) -> str:
        return "one of " + ", ".join(self.values)

    @property
    def choices_metavar(self) -> str:
        """``{a,b,c}``, as argparse shows choices."""
        return "{" + ",".join(self.values) + "}"

    def check(self, value: Any) -> str:
        if value not in self.values:
            raise Refused(self.problem())
        return typing.cast(str, value)


@dataclass(frozen=True)
class Switch(Kind):
    """On or off: a flag without a value; true/false in a file; 1/0, true/false, yes/no, on/off in a variable."""

    @property
    def form(self) -> str:
        return "true or false (1/0, yes/no, on/off)"

    def parse(self, text: str) -> bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise Refused(self.problem())

    def coerce(self, value: Any) -> bool:
        return self.check(value)

    def check(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise Refused(self.problem())
        return value


@dataclass(frozen=True)
class EnvId(Kind):
    """A registered gymnasium env id (checked against gymnasium's registry when gymnasium is installed)."""

    metavar: ClassVar[str] = "ID"

    @property
    def form(self) -> str:
        return "a registered gymnasium env id such as CartPole-v1"

    def check_form(self, value: Any) -> str:
        value = _one_line(value, self, 200)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_./:-]*", value):
            raise Refused(self.problem())
        return typing.cast(str, value)

    def check(self, value: Any) -> str:
        value = self.check_form(value)
        if env_registered(value) is False:
            raise Refused("is not a registered gymnasium env; pass one such as CartPole-v1 (`python -c 'import "
                          "gymnasium; print(list(gymnasium.registry))'` lists them)")
        return typing.cast(str, value)


def env_registered(env_id: str) -> bool | None:
    """Whether gymnasium knows `env_id` (None when gymnasium is not installed: the command's own import says so).

    An id of the ``module:Name-v0`` form imports ``module`` first, as ``gymnasium.make`` does.
    """
    import importlib

    try:  # optional in the device tier (`device._deps.require` pattern): only `device run` needs it
        gymnasium = importlib.import_module("gymnasium")
    except ImportError:
        return None
    from device._obs_pipeline import register_envs

    register_envs()  # strata's own ids (strata/PixelCartPole-v1) are registered on first use
    try:
        gymnasium.spec(env_id)
    except Exception:
        return False
    return True


# ------------------------------------------------------------------------------------------------ network


@dataclass(frozen=True)
class Host(Kind):
    """An IP address or a DNS hostname (`device._names.is_host`)."""

    metavar: ClassVar[str] = "HOST"

    @property
    def form(self) -> str:
        return HOST_FORM

    def check(self, value: Any) -> str:
        if not is_host(value):
            raise Refused(self.problem())
        return typing.cast(str, value)


def split_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` as ``(host, port)``; raise `Refused`."""
    form = "must be HOST:PORT (a host as 127.0.0.1, [::1] or a DNS name, and a port from 1 to 65535)"
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not is_host(host) or not re.fullmatch(r"[0-9]{1,5}", port_text, re.ASCII):
        raise Refused(form)
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise Refused(form)
    return host, port


@dataclass(frozen=True)
class HostPort(Kind):
    """``HOST:PORT`` of a running service (port 1-65535).

    With `several`, a comma-separated list of them; empty only when `empty`.
    """

    empty: bool = False
    several: bool = False
    metavar: ClassVar[str] = "HOST:PORT"

    @property
    def form(self) -> str:
        one = "HOST:PORT (a port from 1 to 65535)"
        return (f"{one}[,HOST:PORT...]" if self.several else one) + (" or empty" if self.empty else "")

    def check(self, value: Any) -> str:
        value = _one_line(value, self, 64 * 1024 if self.several else 300)
        if value == "" and self.empty:
            return typing.cast(str, value)
        parts = value.split(",") if self.several else [value]
        try:
            for part in parts:
                split_host_port(part.strip())
        except Refused:
            raise Refused(self.problem()) from None
        return typing.cast(str, value)


@dataclass(frozen=True)
class Url(Kind):
    """A URL ``scheme://host[:port]`` with a scheme of `schemes`, a valid host and a port 1-65535.

    `path` allows a path after the host (HTTP endpoints); `credentials` allows ``user:pass@`` in it; `empty` takes
    "" as "not set".
    """

    schemes: tuple[str, ...] = ()
    path: bool = False
    credentials: bool = False
    empty: bool = False
    metavar: ClassVar[str] = "URL"

    @property
    def form(self) -> str:
        return (f"a URL {self.schemes[0]}://HOST[:PORT] (scheme {' or '.join(self.schemes)}, a port from 1 to "
                "65535)" + (" or empty" if self.empty else ""))

    def check(self, value: Any) -> str:
        value = _one_line(value, self, 2048)
        if value == "" and self.empty:
            return typing.cast(str, value)
        try:
            parsed = urllib.parse.urlsplit(value)
            port = parsed.port
            hostname = parsed.hostname
        except ValueError:
            raise Refused(self.problem()) from None
        if parsed.scheme not in self.schemes or not is_host(hostname) or "%" in parsed.netloc:
            raise Refused(self.problem())
        if port is not None and port < 1:
            raise Refused(self.problem())
        if not self.path and (parsed.path not in ("", "/") or parsed.query or parsed.fragment):
            raise Refused(f"must be {self.form}, with nothing after the port")
        if not self.credentials and (parsed.username is not None or parsed.password is not None):
            raise Refused("must not hold credentials (user:pass@): a URL ends up in logs and process lists")
        return typing.cast(str, value)


# ------------------------------------------------------------------------------------------------ paths


def _path_text(value: Any, kind: Kind) -> str:
    if not isinstance(value, str | os.PathLike):
        raise Refused(kind.problem())
    text = os.fspath(value)
    if not isinstance(text, str) or not text or "\x00" in text or len(text) > PATH_MAX:
        raise Refused(f"must be a path of 1-{PATH_MAX} characters")
    if _CONTROL.search(text):
        raise Refused("must be a path of printable UTF-8 characters (no control characters or undecodable bytes)")
    if any(len(part.encode()) > NAME_MAX for part in text.split("/")):
        raise Refused(f"must be a path whose every name is at most {NAME_MAX} bytes")
    return text


def _stat(path: Path) -> os.stat_result | None:
    """``os.stat`` of `path`; None when nothing is there; `Refused` when it cannot be looked at."""
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except PermissionError:
        raise Refused("cannot be looked at (permission denied); check the folders' permissions") from None
    except OSError as exc:
        raise Refused(f"cannot be looked at ({exc.strerror or exc})") from None


def _writable_folder(folder: Path, kind: Kind, *, parents: bool) -> None:
    """`folder` (where something will be created) exists, or with `parents` its nearest existing ancestor does."""
    probe = folder
    while True:
        st = _stat(probe)
        if st is not None or not parents or probe.parent == probe:
            break
        probe = probe.parent
    if st is None:
        raise Refused(f"needs its folder {str(folder)!r} to exist; create it first")
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"needs {str(probe)!r} to be a folder, but it is a file")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise Refused(f"needs {str(probe)!r} to be writable")


@dataclass(frozen=True)
class _PathKind(Kind):
    """A path; `check_form` looks at the text only, `check` at what is there. With `empty`, "" means "not set"."""

    empty: bool = dataclasses.field(default=False, kw_only=True)

    def check_form(self, value: Any) -> str:
        if value == "" and self.empty:
            return typing.cast(str, value)
        return _path_text(value, self)

    def check(self, value: Any) -> str:
        if value == "" and self.empty:
            return typing.cast(str, value)
        return self._check_path(_path_text(value, self))

    def _check_path(self, text: str) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class InputFile(_PathKind):
    """An existing regular file this command reads; `max_bytes` caps what it may hold."""

    what: str = "file"
    max_bytes: int | None = None
    content: str = ""
    """What the file holds (``public-key``, ``bundle``, ``edge-config``): for the docs and the fuzz harness."""
    metavar: ClassVar[str] = "FILE"

    @property
    def form(self) -> str:
        cap = f" of at most {self.max_bytes:,} bytes" if self.max_bytes else ""
        return f"an existing, readable {self.what}{cap}"

    def _check_path(self, text: str) -> str:
        st = _stat(Path(text))
        if st is None:
            raise Refused(f"does not exist; pass {self.form}")
        if stat.S_ISDIR(st.st_mode):
            raise Refused(f"is a folder; pass {self.form}")
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"is not a regular file (a device, pipe or socket); pass {self.form}")
        if not os.access(text, os.R_OK):
            raise Refused(f"cannot be read (permission denied); pass {self.form}")
        if self.max_bytes is not None and st.st_size > self.max_bytes:
            raise Refused(f"holds {st.st_size:,} bytes, more than a {self.what} may ({self.max_bytes:,})")
        return text

    def read(self, path: str | Path, *, where: str = "") -> bytes:
        """The file's bytes, at most `max_bytes` (a /proc file that reports size 0 is capped while read)."""
        return read_bounded(Path(path), max_bytes=self.max_bytes or 1 << 40, what=where or self.what)


@dataclass(frozen=True)
class InputFolder(_PathKind):
    """An existing folder this command reads."""

    what: str = "folder"
    content: str = ""
    metavar: ClassVar[str] = "DIR"

    @property
    def form(self) -> str:
        return f"an existing {self.what}"

    def _check_path(self, text: str) -> str:
        st = _stat(Path(text))
        if st is None:
            raise Refused(f"does not exist; pass {self.form}")
        if not stat.S_ISDIR(st.st_mode):
            raise Refused(f"is not a folder; pass {self.form}")
        if not os.access(text, os.R_OK | os.X_OK):
            raise Refused(f"cannot be read (permission denied); pass {self.form}")
        return text


@dataclass(frozen=True)
class OutputFile(_PathKind):
    """A file this command writes (replacing it if it exists): never a folder, and its folder must exist."""

    what: str = "file"
    metavar: ClassVar[str] = "FILE"

    @property
    def form(self) -> str:
        return f"a path for the {self.what} to write, in an existing folder"

    def _check_path(self, text: str) -> str:
        path = Path(text)
        st = _stat(path)
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise Refused(f"is a folder; pass {self.form} (e.g. {str(path / 'NAME')!r})")
            if not stat.S_ISREG(st.st_mode):
                raise Refused(f"exists and is not a regular file (a device, pipe or socket); pass {self.form}")
        _writable_folder(path.absolute().parent, self, parents=False)
        return text


@dataclass(frozen=True)
class OutputFolder(_PathKind):
    """A folder this command creates (or fills if it exists); its parent must exist unless `parents`."""

    what: str = "folder"
    parents: bool = False
    metavar: ClassVar[str] = "DIR"

    @property
    def form(self) -> str:
        where = "" if self.parents else " in an existing folder"
        return f"a {self.what} to create or reuse{where}"

    def _check_path(self, text: str) -> str:
        path = Path(text)
        st = _stat(path)
        if st is not None:
            if not stat.S_ISDIR(st.st_mode):
                raise Refused(f"exists and is not a folder; pass {self.form}")
            if not os.access(text, os.W_OK | os.X_OK):
                raise Refused(f"is not writable; pass {self.form}")
            return text
        _writable_folder(path.absolute().parent, self, parents=self.parents)
        return text


def is_path_kind(kind: Kind) -> bool:
    """Whether `kind` (or the item kind of a `Many`) holds paths (relative ones in a file are relative to it)."""
    return isinstance(kind.item if isinstance(kind, Many) else kind, _PathKind)


def read_bounded(path: Path, *, max_bytes: int, what: str) -> bytes:
    """Read at most `max_bytes` of the regular file `path`; any problem is a one-line `ConfigError` naming it.

    Used for every file strata reads back (its own checkpoints, metrics, caches, kits, state) and for files a
    user names: a folder, a device such as /dev/zero, an unreadable or oversized file never reaches a parser.
    """
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{what} {shown(str(path))} is not a regular file; pass a file")
        if st.st_size > max_bytes:
            raise ConfigError(f"{what} {shown(str(path))} holds {st.st_size:,} bytes, more than it may "
                              f"({max_bytes:,}); is it the right file?")
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{what} {shown(str(path))} cannot be read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{what} {shown(str(path))} holds more than {max_bytes:,} bytes; is it the right file?")
    return data


# ------------------------------------------------------------------------------------------------ lists


@dataclass(frozen=True)
class Many(Kind):
    """A list of `item` values.

    Given as a flag once per item or with several values, a TOML array, or a variable's comma-separated text;
    `min_items`/`max_items` bound the count, `unique` refuses repeats.
    """

    item: Kind = dataclasses.field(default_factory=Text)
    min_items: int = 0
    max_items: int | None = None
    unique: bool = False
    sep: str = ","

    @property
    def form(self) -> str:
        lo, hi = self.min_items or None, self.max_items
        if lo is not None and hi is not None:
            count = f"of {lo} to {hi} items"
        elif lo is not None:
            count = f"of at least {lo} item{'s' if lo > 1 else ''}"
        elif hi is not None:
            count = f"of at most {hi} items"
        else:
            count = "of items"
        return f"a list {count}, each {self.item.form}" + (", none twice" if self.unique else "")

    def parse(self, text: str) -> tuple[Any, ...]:
        return self.check(tuple(self._item(part.strip(), self.item.parse) for part in text.split(self.sep)
                                if part.strip()))

    def coerce(self, value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise Refused(self.problem())
        return self.check(tuple(self._item(v, self.item.coerce) for v in value))

    def _item(self, value: Any, how: Any) -> Any:
        try:
            return how(value)
        except Refused as exc:
            raise Refused(f"item {shown(value)} {exc}") from None

    def check(self, value: Any) -> tuple[Any, ...]:
        return self._check(value, self.item.check)

    def check_form(self, value: Any) -> tuple[Any, ...]:
        return self._check(value, self.item.check_form)

    def _check(self, value: Any, how: Any) -> tuple[Any, ...]:
        if not isinstance(value, list | tuple):
            raise Refused(self.problem())
        items = tuple(self._item(v, how) for v in value)
        if len(items) < self.min_items or (self.max_items is not None and len(items) > self.max_items):
            raise Refused(self.problem())
        if self.unique and len(set(items)) != len(items):
            twice = next(v for v in items if items.count(v) > 1)
            raise Refused(f"names {shown(twice)} twice; {self.problem()}")
        return items


# ------------------------------------------------------------------------------------------------ dataclasses


def declared(kind: Kind, default: Any = dataclasses.MISSING) -> Any:
    """A dataclass field declared as an option of `kind` (its default `default`, if any).

    Example: ``port: int = declared(Port(), 1883)``.
    """
    return dataclasses.field(default=default, metadata={OPTION_KEY: kind})


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def field_kind(cls: type, f: dataclasses.Field[Any]) -> Kind | None:
    """The declared kind of field `f` of `cls`: its metadata, or what its type alone says (bool, Literal)."""
    kind = f.metadata.get(OPTION_KEY)
    if kind is not None:
        return typing.cast(Kind, kind)
    hint = _hints(cls)[f.name]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        non_none = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = non_none[0] if len(non_none) == 1 else hint
    if hint is bool:
        return Switch()
    if typing.get_origin(hint) is typing.Literal:
        return Choice(values=tuple(str(a) for a in typing.get_args(hint)))
    return None


def check_fields(obj: Any, *, names: Sequence[str] | None = None,
                 error: Callable[[str], Exception] | None = None) -> None:
    """Check every declared field of the dataclass instance `obj` against its kind (None means "not set").

    Config dataclasses call this first in ``__post_init__``, so a value built in code, read from a checkpoint or
    merged from a file is held to the same declaration as the flag. It checks the values themselves
    (`Kind.check_form`): what a path points at and whether an env id is registered are checked where the value
    is given (flag, file, variable) and by the command's own check, not every time a config is built.

    `error` makes the refusal the config's own error type (same text), e.g. ``error=EdgeConfigError``.

    Raises:
        ConfigError: ``ClassName.field 'VALUE': must be ...`` (or `error` of that text).
    """
    cls = type(obj)
    for f in dataclasses.fields(obj):
        if names is not None and f.name not in names:
            continue
        value = getattr(obj, f.name)
        if value is None:
            continue
        kind = field_kind(cls, f)
        if kind is None:
            continue
        try:
            kind.check_form(value)
        except Refused as exc:
            refused = refusal(f"{cls.__name__}.{f.name}", value, str(exc))
            raise (refused if error is None else error(str(refused))) from None
