"""The one rule for identifiers (node, device, fleet, stage, policy names) and for paths built from them.

An identifier is 1-64 characters: a letter or digit, then letters, digits, ``_``, ``-`` or ``.``. That keeps it a
single MQTT topic level (no ``/``, ``+``, ``#``), a single path component that is never ``.`` or ``..``, and a
part of an AWS resource name. Every command, topic builder and path builder checks identifiers here, and every
path built from one goes through `inside`, which refuses a result that leaves its root (through ``..``, an
absolute part or a symbolic link).

Network addresses that a command writes into a config (a bind address, a broker URL's host) follow `is_host`:
an IP literal or a DNS hostname, nothing else (no spaces, ';', quotes or newlines that would smuggle a directive
into a config file).

Error messages quote at most `SHOWN_CHARS` characters of a bad value (`shown`), so a 10 MB argument gives a
one-line error.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

from device._errors import ConfigError

IDENTIFIER_MAX = 64
IDENTIFIER_FORM = "1-64 letters, digits, '_', '-' or '.', starting with a letter or digit"
_IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SHOWN_CHARS = 80
HOST_FORM = "an IP address (127.0.0.1, ::1) or a DNS hostname (letters, digits, '-' and '.')"
_HOST_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """``repr(value)`` of a str (or ``str(value)``) cut to `limit` characters, marked with ``...`` when cut."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_identifier(value: object) -> bool:
    """Whether `value` is a str that follows the identifier rule."""
    return isinstance(value, str) and _IDENTIFIER.fullmatch(value) is not None


def identifier(value: object, *, what: str) -> str:
    """Return `value` if it follows the identifier rule, else raise one line naming `what` and the rule.

    Raises:
        ConfigError: `value` is not a str of the identifier form.
    """
    if not is_identifier(value):
        raise ConfigError(f"{what} must be {IDENTIFIER_FORM}; got {shown(value)}")
    assert isinstance(value, str)
    return value


def inside(root: Path | str, *parts: str, what: str) -> Path:
    """``root / parts...`` resolved, refused when it is not strictly inside the resolved `root`.

    Resolving follows symbolic links that exist, so a link planted under `root` that points out of it is refused
    too.

    Raises:
        ConfigError: the path would leave `root` (or be `root` itself).
    """
    base = Path(root).resolve()
    target = base.joinpath(*parts).resolve()
    if target == base or base not in target.parents:
        joined = "/".join(parts)
        raise ConfigError(f"{what}: {shown(joined)} leads outside {str(base)!r}; use a plain name inside it")
    return target


def is_host(value: object) -> bool:
    """Whether `value` is an IP address literal or a DNS hostname (RFC 1123 labels, at most 253 characters)."""
    if not isinstance(value, str) or not value or "%" in value:  # an IPv6 scope id may hold any text
        return False
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        pass
    name = value[:-1] if value.endswith(".") else value
    return 0 < len(name) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


def host(value: object, *, what: str) -> str:
    """Return `value` if `is_host`, else raise one line naming `what` and the form.

    Raises:
        ConfigError: `value` is neither an IP address nor a hostname.
    """
    if not is_host(value):
        raise ConfigError(f"{what} must be {HOST_FORM}; got {shown(value)}")
    assert isinstance(value, str)
    return value
