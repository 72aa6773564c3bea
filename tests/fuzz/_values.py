"""Hostile and valid values for an option, from its declaration (`device._options.Kind.describe()`).

Plain data in, plain strings out (standard library only), so the same values drive the hypothesis harness
(tests/fuzz/test_cli_fuzz.py) and the census of a checkout without declarations (tests/fuzz/census.py).

Each hostile value carries its family, the one the issue counts tracebacks by:

    numbers    negative, zero, bounds +- 1, huge, NaN/inf, not a number
    paths      a file, a folder, a missing path, a missing parent, /proc, /dev/zero, an unwritable folder
    endpoints  malformed URLs, bad schemes, ports out of range, hosts that are not hosts
    text       empty, blank, unicode, control characters, option-like text
    echoes     a 200 KB value (the error must still be one short line)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BIG = 200_000
"""Characters of the value that tests echoes."""
FAMILIES = ("numbers", "paths", "files we wrote", "endpoints", "late refusals", "echoes", "text")


@dataclass(frozen=True)
class Places:
    """Paths of the sandbox a case runs in: what the path values point at.

    `prepare` fills the sandbox before each case: an existing file, a folder with a file in it, and links to
    /dev/null and /dev/zero (an output path is never a device itself: writing a file over /dev/null as root would
    replace the device for the whole machine).
    """

    root: Path
    """The case's working folder (the output paths go here)."""
    fixtures: Mapping[str, Path]
    """Content tag -> a real file or folder of that content (keys, bundles, configs, a run dir)."""
    fixtures_root: Path | None = None
    """The folder the fixtures live in (nothing may be created there)."""

    @property
    def text_file(self) -> Path:
        """A plain readable text file in the sandbox."""
        return self.root / "existing.txt"

    @property
    def folder(self) -> Path:
        """An existing folder with a file in it, in the sandbox."""
        return self.root / "existing-dir"

    def prepare(self) -> None:
        """Create the sandbox's own files (the folder `root` exists and is empty)."""
        self.text_file.write_text("hello\n")
        self.folder.mkdir()
        (self.folder / "file.txt").write_text("x\n")
        (self.root / "devnull-link").symlink_to("/dev/null")
        (self.root / "zero-link").symlink_to("/dev/zero")

    def fixture(self, content: str) -> Path | None:
        """The fixture for `content` (None when there is none)."""
        return self.fixtures.get(content)

    def sandbox_files(self) -> set[str]:
        """What `prepare` made, relative to `root`."""
        return {"existing.txt", "existing-dir", "existing-dir/file.txt", "devnull-link", "zero-link"}


def family_of(desc: Mapping[str, Any]) -> str:
    """The family of a kind's hostile values."""
    kind = desc["kind"]
    if kind == "Many":
        return family_of(desc["item"])
    if kind in ("Integer", "Number"):
        return "endpoints" if desc.get("unit") == "port" else "numbers"
    if kind in ("InputFile", "InputFolder", "OutputFile", "OutputFolder"):
        return "paths"
    if kind in ("Url", "Host", "HostPort"):
        return "endpoints"
    return "text"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e18 else repr(x)


def hostile(desc: Mapping[str, Any], places: Places) -> list[tuple[str, str]]:
    """``(family, text)`` values a command must refuse in one line, or accept: never a traceback."""
    kind = desc["kind"]
    family = family_of(desc)
    out: list[tuple[str, str]] = [("echoes", "x" * BIG), (family, "")]
    if kind == "Many":
        return [(f, v) for f, v in hostile(desc["item"], places)] + [(family, ",,"), (family, " , ")]
    if kind in ("Integer", "Number"):
        lo, hi = desc.get("min"), desc.get("max")
        values = ["-1", "0", "1", "-2", "99999", "4294967296", "9" * 30, "nan", "inf", "-inf", "1e309", "1.5",
                  "0x10", "\u0661", " 7", "1_0"]
        for bound, step in ((lo, -1), (hi, 1)):
            if bound is not None:
                values += [_num(bound), _num(bound + step)]
                if kind == "Number":
                    values.append(repr(bound + step * 1e-9))
        out += [(family, v) for v in dict.fromkeys(values)]
    elif kind in ("InputFile", "InputFolder"):
        missing = places.root / "missing"
        out += [(family, str(v)) for v in (
            places.text_file, places.folder, missing, missing / "child", "/proc/self/status", "/proc/self",
            "/proc/self/mem", "/dev/zero", "/dev/null", places.root / "zero-link", "/proc/self/status/child",
            "a" * 300, "bad\nname")]
        for content in ("bundle", "device-bundle", "public-key", "private-key", "edge-config", "run-dir", "kit",
                        "spaces"):
            fixture = places.fixture(content)
            if fixture is not None and content != desc.get("content"):
                out.append((family, str(fixture)))
    elif kind in ("OutputFile", "OutputFolder"):
        missing = places.root / "missing"
        out += [(family, str(v)) for v in (
            places.text_file, places.folder, missing, missing / "child", places.root / "devnull-link",
            places.root / "zero-link", "/proc/self/newfile", "/proc/self", "/proc/self/status/child",
            "a" * 300, "bad\nname", places.text_file / "child")]
    elif kind in ("Url", "Host", "HostPort"):
        out += [(family, v) for v in (
            "garbage://x", "notaurl", "mqtt://", "mqtt://host:70000", "mqtt://host:0", "mqtt://host:-1",
            "mqtt://[::1", "mqtt://user:pw@host", "http://host/path?q=1", "mqtts://h\u00e9st", "127.0.0.1:99999",
            "host:", ":80", "[::1]:0", "a b", "localhost", "1.2.3.4.5")]
    else:
        out += [(family, v) for v in (" ", "\u30ce\u30fc\u30c9", "a\nb", "-x", "..", "a/b", "#", "+", "%s", "\t")]
        for value in desc.get("values") or ():
            out.append((family, value.upper() + "x"))
    return out


def valid(desc: Mapping[str, Any], places: Places) -> str | None:
    """A value the kind accepts in this sandbox (None when it needs a fixture there is none of)."""
    kind = desc["kind"]
    if kind == "Many":
        return valid(desc["item"], places)
    if kind == "Integer":
        lo, hi = desc.get("min"), desc.get("max")
        value = 1 if lo is None or lo <= 1 else lo
        return str(value if hi is None or value <= hi else hi)
    if kind == "Number":
        lo, hi = desc.get("min"), desc.get("max")
        value = 0.5 if lo is None or lo <= 0.5 else lo + 1.0
        return _num(value if hi is None or value < hi else (hi if not desc.get("max_open") else hi / 2))
    if kind == "Choice":
        return str(desc["values"][0])
    if kind == "Name":
        return "node-1"
    if kind == "EnvId":
        return "CartPole-v1"
    if kind == "Host":
        return "127.0.0.1"
    if kind == "HostPort":
        return "127.0.0.1:9"
    if kind == "Url":
        scheme = desc["schemes"][0]
        return f"{scheme}://127.0.0.1:9"
    if kind in ("InputFile", "InputFolder"):
        content = desc.get("content") or ""
        fixture = places.fixture(content) if content else (places.text_file if kind == "InputFile" else places.folder)
        return None if fixture is None else str(fixture)
    if kind == "OutputFile":
        return str(places.root / "out.file")
    if kind == "OutputFolder":
        return str(places.root / "out-dir")
    if kind == "Matching":
        return desc.get("example") or None
    return "abc"
