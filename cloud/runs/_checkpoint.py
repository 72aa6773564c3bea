"""Training checkpoints: ``RUN_DIR/checkpoints/{version:09d}.pt``, written atomically, loaded without unpickling code.

A checkpoint is a dict of tensors and plain values (agent and optimiser state dicts, normaliser
statistics, the config as a dict, the policy version and env-step counters), so
``torch.load(weights_only=True)`` can read it: a checkpoint file never runs code. It is written to a
temporary file in the same folder and renamed into place, so a crash never leaves a torn file
under a checkpoint name, and names sort by version.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from device import ConfigError, atomic_file, shown

CHECKPOINT_DIR = "checkpoints"
"""Sub-folder of a run dir that holds its checkpoints."""

FORMAT = 1
"""Version of the checkpoint layout; bumped when keys change meaning."""


def checkpoint_path(run_dir: Path, version: int) -> Path:
    """Return where the checkpoint of policy `version` lives in `run_dir`."""
    return Path(run_dir) / CHECKPOINT_DIR / f"{version:09d}.pt"


def save_checkpoint(run_dir: Path, state: dict[str, Any], *, durable: bool = True) -> Path:
    """Write `state` (which must hold an int ``"version"``) atomically as the checkpoint of that version.

    `durable` fsyncs it (it survives a power loss); without, it survives a kill of the process only.
    """
    import torch

    path = checkpoint_path(run_dir, int(state["version"]))
    with atomic_file(path, durable=durable) as f:
        torch.save({"format": FORMAT, **state}, f)
    return path


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Return the run's checkpoints, oldest version first."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.pt") if p.stem.isdigit())


def latest_checkpoint(run_dir: Path) -> Path | None:
    """Return the checkpoint with the highest version, or None when the run has none."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


MAX_CHECKPOINT_BYTES = 8 << 30
"""A checkpoint file above this is refused unread (strata's are MBs; a replay buffer's a few GB)."""

_FIELDS: dict[str, type | tuple[type, ...]] = {"version": int, "global_step": int, "env_id": str, "config": dict}
"""What every checkpoint holds, and of which type; the learner that restores one reads the rest under `reading`."""


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (tensors and plain values only, never code).

    Raises:
        ConfigError: One line naming the file and what to do: missing, not a regular file, over
            `MAX_CHECKPOINT_BYTES`, unreadable, or without the fields every checkpoint holds.
    """
    import pickle
    import stat
    import zipfile

    import torch

    path = Path(path)
    fallback = "delete it to fall back to the previous checkpoint"
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"load_checkpoint: {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"load_checkpoint: {path} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CHECKPOINT_BYTES:
        raise ConfigError(f"load_checkpoint: {path} is not a strata checkpoint (not a regular file, or over "
                          f"{MAX_CHECKPOINT_BYTES:,} bytes); {fallback}")
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile, KeyError,
            IndexError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"load_checkpoint: {path} is not a readable strata checkpoint (truncated, empty or "
                          f"corrupt: {first[:160]}); {fallback}") from None
    if not isinstance(state, dict) or "version" not in state:
        raise ConfigError(f"load_checkpoint: {path} is not a strata checkpoint (no version); {fallback}")
    if state.get("format") != FORMAT:
        raise ConfigError(f"load_checkpoint: {path} has checkpoint format {shown(state.get('format'))}, "
                          f"this strata reads format {FORMAT}; export it with the strata that wrote it")
    for name, kind in _FIELDS.items():
        value = state.get(name)
        if not isinstance(value, kind) or isinstance(value, bool) or (isinstance(value, int) and value < 0):
            raise ConfigError(f"load_checkpoint: {path} is damaged: {name} is {shown(value)}, not a "
                              f"{getattr(kind, '__name__', kind)}; {fallback}")
    if state.get("algo", "ppo") not in ("ppo", "sac"):
        raise ConfigError(f"load_checkpoint: {path} is damaged: algo is {shown(state.get('algo'))}; {fallback}")
    return state


@contextlib.contextmanager
def reading(path: Path | None) -> Iterator[None]:
    """Restore a learner (or build an export) from the checkpoint `path`: what it cannot read is one line.

    A checkpoint that passed `load_checkpoint` can still hold tensors of the wrong shape or miss a learner's
    keys (damage, or a file written by another strata); the restore fails with torch's or Python's own error,
    which this turns into one line naming the file and what to do.
    """
    try:
        yield
    except ConfigError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as exc:
        raise ConfigError(f"checkpoint {path} does not read back ({type(exc).__name__}: {shown(str(exc), 120)}); it "
                          "is damaged or from another strata version: delete it to fall back to the previous "
                          "checkpoint") from None


def load_latest_checkpoint(run_dir: Path, *, caller: str) -> dict[str, Any]:
    """Load the newest checkpoint of `run_dir`, or raise `ConfigError` naming `caller` when there is none.

    A live run replaces its rolling checkpoint with a newer one as it goes: a newest file that is gone by the
    time it is opened is looked up again (a few times), not reported as missing.
    """
    for attempt in range(LATEST_ATTEMPTS):
        path = latest_checkpoint(run_dir)
        if path is None:
            raise ConfigError(f"{caller}: run dir {str(run_dir)!r} has no checkpoints under {CHECKPOINT_DIR}/; "
                              "train one first with `strata train --run-dir DIR ...`")
        try:
            return load_checkpoint(path)
        except ConfigError:
            if path.exists() or attempt == LATEST_ATTEMPTS - 1:  # the file itself is bad, or it keeps vanishing
                raise
    raise AssertionError("unreachable")


LATEST_ATTEMPTS = 10
"""How often `load_latest_checkpoint` looks up the newest checkpoint again when the one it found vanished."""


def resumed_config(cls: Any, run_dir: Path) -> Any:
    """The hyperparameters (``cls.from_dict``) of the run dir's newest checkpoint, or None when it has none."""
    path = latest_checkpoint(run_dir)
    if path is None:
        return None
    state = load_checkpoint(path)
    with reading(path):
        return cls.from_dict(state["config"])
