"""Training checkpoints: ``RUN_DIR/checkpoints/{version:09d}.pt``, written atomically, loaded without unpickling code.

A checkpoint is a dict of tensors and plain values (agent and optimiser state dicts, normaliser
statistics, the config as a dict, the policy version and env-step counters), so
``torch.load(weights_only=True)`` can read it: a checkpoint file never runs code. It is written to a
temporary file in the same folder and renamed into place, so a crash never leaves a torn file
under a checkpoint name, and names sort by version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from device import ConfigError, atomic_file

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


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (tensors and plain values only, never code)."""
    import pickle
    import zipfile

    import torch

    try:
        state: dict[str, Any] = torch.load(Path(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"load_checkpoint: {path} does not exist") from None
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"load_checkpoint: {path} is not a readable strata checkpoint (truncated, empty or "
                          f"corrupt: {first[:160]}); delete it to fall back to the previous checkpoint") from None
    if not isinstance(state, dict) or "version" not in state:
        raise ConfigError(f"load_checkpoint: {path} is not a strata checkpoint (no version); delete it to fall "
                          "back to the previous checkpoint")
    if state.get("format") != FORMAT:
        raise ConfigError(f"load_checkpoint: {path} has checkpoint format {state.get('format')!r}, "
                          f"this strata reads format {FORMAT}; export it with the strata that wrote it")
    return state


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
    return None if path is None else cls.from_dict(load_checkpoint(path)["config"])
