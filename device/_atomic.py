"""Atomic file writes: every artifact goes to a temp file in its folder, then is renamed into place.

A reader (or a process restarted after a crash) sees the old file or the new one, never half of
one. With ``durable`` the data and the rename are also on disk before the call returns (fsync of
the file, then of the folder), which is what caches and checkpoints that must survive kill -9 need.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def fsync_dir(folder: Path) -> None:
    """Fsync a folder, so a rename or unlink inside it is on disk."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: Path | str, *, mode: int | None = None, durable: bool = True) -> Iterator[BinaryIO]:
    """Open a temp file next to `path` for binary writing; on success it replaces `path`, on error it is removed.

    Args:
        path: The final file; its folder is created if missing.
        mode: Permission bits of the new file (e.g. ``0o600`` for secrets); None keeps mkstemp's 0600
            widened by the umask to what a plain ``open`` would give.
        durable: fsync the file and its folder, so the new content survives a power loss or kill -9.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path | str, data: bytes | str, *, mode: int | None = None, durable: bool = True) -> Path:
    """Write `data` (text is UTF-8) to `path` atomically; return the path. See `atomic_file`."""
    with atomic_file(path, mode=mode, durable=durable) as f:
        f.write(data.encode() if isinstance(data, str) else data)
    return Path(path)
