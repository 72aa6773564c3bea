"""Function packages: a Lambda-platform dependency tree (pip, no Docker), cached by requirement hash, and a zip.

    requirements ─> deps_key() ─> cache hit?  ─yes─> {cache}/{key}/
                                      └─no──> pip install --platform manylinux2014_<arch> --only-binary=:all:
                                              --python-version 3.12 --implementation cp -t <tmp>; rename into place
    deps tree + strata's functions/ and device/ sources ─> deterministic zip ─> size guards ─> `Artifact`

The zip is byte-for-byte reproducible (sorted entries, fixed timestamps and modes), so an unchanged
deployment has an unchanged CodeSha256 and `apply` is a no-op. The size guards measure the real artifact:
the sum of its files' sizes against 250 MB unzipped, the zip itself against 50 MB.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from infra._errors import PackageError, PackageTooLargeError
from infra._models import PLATFORMS, PYTHON_VERSION, SOURCE_PACKAGES, Artifact

MB = 1024 * 1024
LAMBDA_ZIPPED_LIMIT = 50 * MB
"""Lambda's limit on a zip deployment package."""
LAMBDA_UNZIPPED_LIMIT = 250 * MB
"""Lambda's limit on the unzipped package (function code plus layers)."""
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_MANIFEST = "strata-deps.json"
_SKIP_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache"}


def deps_key(requirements: Sequence[str], *, architecture: str, python_version: str = PYTHON_VERSION) -> str:
    """Hash of a requirement set and the platform it is built for: the cache folder's name."""
    spec = {"requirements": sorted(r.strip() for r in requirements), "platform": PLATFORMS[architecture],
            "python_version": python_version, "implementation": "cp", "abi": "only-binary"}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:24]


def pip_command(requirements: Sequence[str], target: Path, *, architecture: str,
                python_version: str = PYTHON_VERSION) -> list[str]:
    """The pip command line that builds a Lambda-ready tree for `architecture` without Docker."""
    return [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile",
            "--platform", PLATFORMS[architecture], "--only-binary=:all:", "--python-version", python_version,
            "--implementation", "cp", "-t", str(target), *requirements]


def build_dependencies(requirements: Sequence[str], *, cache_dir: Path, architecture: str,
                       python_version: str = PYTHON_VERSION, timeout_s: float = 600.0) -> Path:
    """Return the cached dependency tree of `requirements`, building it with pip on a cache miss.

    Raises:
        PackageError: pip failed (its last output lines are in the message).
    """
    key = deps_key(requirements, architecture=architecture, python_version=python_version)
    final = cache_dir / key
    if (final / _MANIFEST).exists():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir, prefix=f".{key}."))
    try:
        if requirements:
            cmd = pip_command(requirements, tmp, architecture=architecture, python_version=python_version)
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired as exc:
                raise PackageError(f"build_dependencies: pip did not finish in {timeout_s:g}s for "
                                   f"{list(requirements)}; check the package index is reachable") from exc
            if done.returncode != 0:
                tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
                raise PackageError(f"build_dependencies: pip could not install {list(requirements)} for "
                                   f"{PLATFORMS[architecture]} / Python {python_version} (exit {done.returncode}); "
                                   f"every requirement needs a binary wheel for that platform. pip said:\n{tail}")
        (tmp / _MANIFEST).write_text(json.dumps({"requirements": list(requirements), "architecture": architecture,
                                                 "python_version": python_version}, indent=2) + "\n")
        try:
            os.replace(tmp, final)
        except OSError:
            if not (final / _MANIFEST).exists():  # another process won the race only if it finished
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _source_root(package: str, source_dir: Path | None) -> Path:
    if source_dir is not None:
        root = source_dir / package
        if not (root / "__init__.py").is_file():
            raise PackageError(f"build_package: {root} is not a Python package; point --source-dir at the folder "
                               f"that holds {', '.join(SOURCE_PACKAGES)}")
        return root
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise PackageError(f"build_package: strata package {package!r} is not importable; install strata "
                           "with the functions extra (pip install 'strata[functions]')")
    return Path(next(iter(spec.submodule_search_locations)))


def _files(root: Path, arc_prefix: str) -> Iterator[tuple[str, Path]]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            yield (f"{arc_prefix}/{rel}" if arc_prefix else rel), path


def package_entries(deps_dir: Path, packages: Sequence[str] = SOURCE_PACKAGES,
                    source_dir: Path | None = None) -> list[tuple[str, Path]]:
    """Every ``(name in the zip, file)`` of a function package, sorted."""
    entries = dict(_files(deps_dir, ""))
    entries.pop(_MANIFEST, None)
    for package in packages:
        entries.update(_files(_source_root(package, source_dir), package))
    return sorted(entries.items())


def build_package(deps_dir: Path, out: Path, *, what: str, packages: Sequence[str] = SOURCE_PACKAGES,
                  source_dir: Path | None = None, zipped_limit: int = LAMBDA_ZIPPED_LIMIT,
                  unzipped_limit: int = LAMBDA_UNZIPPED_LIMIT) -> Artifact:
    """Zip `deps_dir` plus strata's `packages` into `out` reproducibly and check Lambda's size limits.

    Args:
        deps_dir: A dependency tree from `build_dependencies`.
        out: Where the zip goes (written to a temp file, then renamed into place).
        what: The function's name, for error messages.
        packages: strata packages to include as source.
        source_dir: Folder holding `packages` (default: where Python imports them from).
        zipped_limit: Bytes the zip may have (Lambda: 50 MB).
        unzipped_limit: Bytes its files may have together (Lambda: 250 MB).

    Raises:
        PackageTooLargeError: Over either limit; the message gives the measured size and what to drop.
    """
    entries = package_entries(deps_dir, packages, source_dir)
    unzipped = sum(path.stat().st_size for _, path in entries)
    fingerprint = _fingerprint(entries)
    sidecar = out.with_name(out.name + ".json")
    reused = _reuse(out, sidecar, fingerprint)
    if reused is not None and reused.zipped_bytes <= zipped_limit and unzipped <= unzipped_limit:
        return reused
    if unzipped > unzipped_limit:
        raise PackageTooLargeError(
            f"build_package({what!r}): the package is {unzipped / MB:.1f} MB unzipped, over Lambda's "
            f"{unzipped_limit / MB:g} MB limit; remove requirements from --requirements or move large "
            "data to the stage bucket and fetch it at run time")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with tmp.open("wb") as f:
            _write_zip(entries, f)
        zipped = tmp.stat().st_size
        if zipped > zipped_limit:
            raise PackageTooLargeError(
                f"build_package({what!r}): the package is {zipped / MB:.1f} MB zipped, over Lambda's "
                f"{zipped_limit / MB:g} MB limit for a zip package; remove requirements from --requirements "
                "(each must be needed by the handler) or split the function")
        digest = hashlib.sha256()
        with tmp.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    artifact = Artifact(path=out, sha256_b64=base64.b64encode(digest.digest()).decode(),
                        sha256_hex=digest.hexdigest(), zipped_bytes=zipped, unzipped_bytes=unzipped)
    sidecar.write_text(json.dumps({"fingerprint": fingerprint, "sha256_b64": artifact.sha256_b64,
                                   "sha256_hex": artifact.sha256_hex, "zipped_bytes": zipped,
                                   "unzipped_bytes": unzipped}))
    return artifact


def _write_zip(entries: Sequence[tuple[str, Path]], f: BinaryIO) -> None:
    """The reproducible zip of `entries` into the seekable file `f` (same bytes for a file or a BytesIO)."""
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for arcname, path in entries:
            info = zipfile.ZipInfo(arcname, date_time=_ZIP_EPOCH)
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            with path.open("rb") as src, zf.open(info, "w") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


def cached_dependencies(requirements: Sequence[str], *, cache_dir: Path, architecture: str,
                        python_version: str = PYTHON_VERSION) -> Path | None:
    """The cached dependency tree of `requirements`, or None when it was never built (read-only)."""
    final = cache_dir / deps_key(requirements, architecture=architecture, python_version=python_version)
    return final if (final / _MANIFEST).exists() else None


def package_digest(deps_dir: Path, out: Path, *, packages: Sequence[str] = SOURCE_PACKAGES,
                   source_dir: Path | None = None) -> Artifact:
    """The `Artifact` `build_package` would make at `out`, without writing anything.

    The zip at `out` is reused when it was built from the same inputs; otherwise the zip is made in memory
    and hashed (reproducible, so its hash is the one `build_package` will write). ``path`` is `out`, which
    need not exist: only `apply` writes it.
    """
    entries = package_entries(deps_dir, packages, source_dir)
    reused = _reuse(out, out.with_name(out.name + ".json"), _fingerprint(entries))
    if reused is not None:
        return reused
    buffer = io.BytesIO()
    _write_zip(entries, buffer)
    data = buffer.getbuffer()
    digest = hashlib.sha256(data)
    return Artifact(path=out, sha256_b64=base64.b64encode(digest.digest()).decode(), sha256_hex=digest.hexdigest(),
                    zipped_bytes=len(data), unzipped_bytes=sum(path.stat().st_size for _, path in entries))


def _fingerprint(entries: Sequence[tuple[str, Path]]) -> str:
    """Names, sizes and modification times of every input file: equal fingerprints give equal zips."""
    h = hashlib.sha256()
    for arcname, path in entries:
        st = path.stat()
        h.update(f"{arcname}\0{st.st_size}\0{st.st_mtime_ns}\0{os.access(path, os.X_OK)}\n".encode())
    return h.hexdigest()


def _reuse(out: Path, sidecar: Path, fingerprint: str) -> Artifact | None:
    """The zip at `out` if it was built from inputs with `fingerprint` (a 72 MB tree takes ~10 s to zip)."""
    try:
        meta = json.loads(sidecar.read_text())
        if meta.get("fingerprint") != fingerprint or out.stat().st_size != meta["zipped_bytes"]:
            return None
        return Artifact(path=out, sha256_b64=meta["sha256_b64"], sha256_hex=meta["sha256_hex"],
                        zipped_bytes=int(meta["zipped_bytes"]), unzipped_bytes=int(meta["unzipped_bytes"]))
    except (OSError, ValueError, KeyError):
        return None
