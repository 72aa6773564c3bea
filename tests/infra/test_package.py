"""Function packages and config checks: reproducible zips, real size guards, pip for Lambda's platform, errors."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from infra._errors import DeployConfigError, PackageError, PackageTooLargeError
from infra._models import FUNCTIONS, DeployConfig, check_config
from infra._package import (
    LAMBDA_UNZIPPED_LIMIT,
    LAMBDA_ZIPPED_LIMIT,
    build_dependencies,
    build_package,
    deps_key,
    pip_command,
)
from tests.infra.conftest import DEFAULT_REQUIREMENTS, prebuilt_cache


def test_lambda_limits_are_the_documented_ones() -> None:
    assert LAMBDA_ZIPPED_LIMIT == 50 * 1024 * 1024
    assert LAMBDA_UNZIPPED_LIMIT == 250 * 1024 * 1024


def test_the_deployed_handlers_exist_in_the_functions_tier() -> None:
    import importlib

    for spec in FUNCTIONS:
        module, _, attr = spec.handler.rpartition(".")
        assert callable(getattr(importlib.import_module(module), attr)), spec.handler


@pytest.mark.parametrize(("overrides", "message"), [
    ({"memory_mb": 20000}, "DeployConfig.memory_mb 20000: must be a whole number of MB from 128 to 10240"),
    ({"memory_mb": 64}, "DeployConfig.memory_mb 64: must be a whole number of MB from 128 to 10240"),
    ({"timeout_s": 1200}, "DeployConfig.timeout_s 1200: must be a whole number of seconds from 1 to 900"),
    ({"timeout_s": 0}, "DeployConfig.timeout_s 0: must be a whole number of seconds from 1 to 900"),
    ({"reserved_concurrency": -1}, "DeployConfig.reserved_concurrency -1: must be an integer from 0 to"),
    ({"stage": "Prod_1"}, "DeployConfig.stage 'Prod_1': must be a stage name: 1-20 lowercase letters"),
    ({"edge_nodes": ("ok", "bad/node")}, "DeployConfig.edge_nodes ('ok', 'bad/node'): item 'bad/node' must be 1-64 "
                                         "letters"),
    ({"edge_nodes": ("a", "a")}, "DeployConfig.edge_nodes ('a', 'a'): names 'a' twice"),
    ({"fleet": "a/b"}, "DeployConfig.fleet 'a/b': must be 1-64 letters, digits"),
    ({"bucket": "Not_A_Bucket"}, "DeployConfig.bucket 'Not_A_Bucket': must be an S3 bucket name"),
])
def test_config_checks_name_the_value_and_the_fix(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(DeployConfigError, match=re.escape(message)):
        check_config(DeployConfig(**overrides))  # type: ignore[arg-type]


def test_config_errors_are_value_errors_too() -> None:
    with pytest.raises(ValueError):
        check_config(DeployConfig(memory_mb=1))


def test_pip_builds_for_lambdas_platform_without_docker(tmp_path: Path) -> None:
    cmd = pip_command(["numpy"], tmp_path, architecture="arm64")
    joined = " ".join(cmd)
    assert "--platform manylinux2014_aarch64 --only-binary=:all: --python-version 3.12 --implementation cp" in joined
    assert cmd[-1] == "numpy" and "-t" in cmd
    assert "manylinux2014_x86_64" in pip_command(["numpy"], tmp_path, architecture="x86_64")


def test_the_cache_key_depends_on_the_requirement_set_and_platform() -> None:
    a = deps_key(["numpy", "gymnasium"], architecture="x86_64")
    assert a == deps_key(["gymnasium", "numpy"], architecture="x86_64")  # order does not matter
    assert a != deps_key(["gymnasium", "numpy"], architecture="arm64")
    assert a != deps_key(["numpy"], architecture="x86_64")


def test_a_cached_dependency_tree_is_reused_without_pip(tmp_path: Path) -> None:
    entry = prebuilt_cache(tmp_path)
    (entry / "marker.txt").write_text("from the cache")
    assert build_dependencies(DEFAULT_REQUIREMENTS, cache_dir=tmp_path, architecture="x86_64") == entry


def test_real_pip_builds_a_small_requirement_set_into_the_cache(tmp_path: Path) -> None:
    # One tiny pure-Python wheel keeps this fast; the command is the one used for numpy/gymnasium.
    tree = build_dependencies(["six==1.17.0"], cache_dir=tmp_path, architecture="x86_64")
    assert (tree / "six.py").is_file()
    assert not (tree / "__pycache__").exists()  # --no-compile: host-Python bytecode would be useless on 3.12
    assert [p.name for p in tmp_path.iterdir()] == [tree.name]  # no temp folders left
    again = build_dependencies(["six==1.17.0"], cache_dir=tmp_path, architecture="x86_64")
    assert again == tree


def test_a_requirement_without_a_lambda_wheel_fails_with_pips_reason(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match=re.escape("build_dependencies: pip could not install "
                                                     "['strata-no-such-package-xyz']")):
        build_dependencies(["strata-no-such-package-xyz"], cache_dir=tmp_path, architecture="x86_64")


def test_packages_are_reproducible_and_hold_the_handlers(tmp_path: Path, source_snapshot: Path) -> None:
    deps = tmp_path / "deps"
    (deps / "somedep").mkdir(parents=True)
    (deps / "somedep" / "__init__.py").write_text("VALUE = 1\n")
    (deps / "strata-deps.json").write_text("{}")
    a = build_package(deps, tmp_path / "a.zip", what="rollout", source_dir=source_snapshot)
    b = build_package(deps, tmp_path / "b.zip", what="rollout", source_dir=source_snapshot)
    assert a.sha256_b64 == b.sha256_b64 and a.zipped_bytes == a.path.stat().st_size
    names = zipfile.ZipFile(a.path).namelist()
    assert "functions/_handlers.py" in names and "device/__init__.py" in names and "somedep/__init__.py" in names
    assert "strata-deps.json" not in names and not any("__pycache__" in n for n in names)
    assert names == sorted(names)
    assert a.unzipped_bytes == sum(i.file_size for i in zipfile.ZipFile(a.path).infolist())
    assert a.key == f"functions/{a.sha256_hex}.zip"


def test_an_unchanged_package_is_not_zipped_again_and_a_changed_one_is(tmp_path: Path, source_snapshot: Path
                                                                        ) -> None:
    deps = tmp_path / "deps"
    deps.mkdir()
    (deps / "dep.py").write_text("X = 1\n")
    first = build_package(deps, tmp_path / "f.zip", what="rollout", source_dir=source_snapshot)
    built_at = first.path.stat().st_mtime_ns
    again = build_package(deps, tmp_path / "f.zip", what="rollout", source_dir=source_snapshot)
    assert again == first and again.path.stat().st_mtime_ns == built_at
    (deps / "dep.py").write_text("X = 22\n")
    changed = build_package(deps, tmp_path / "f.zip", what="rollout", source_dir=source_snapshot)
    assert changed.sha256_b64 != first.sha256_b64
    assert zipfile.ZipFile(changed.path).read("dep.py") == b"X = 22\n"


def test_size_guards_measure_the_real_artifact(tmp_path: Path, source_snapshot: Path) -> None:
    deps = tmp_path / "deps"
    deps.mkdir()
    (deps / "blob.bin").write_bytes(bytes(range(256)) * 4096)  # 1 MB, barely compressible
    probe = build_package(deps, tmp_path / "probe.zip", what="rollout", source_dir=source_snapshot)
    with pytest.raises(PackageTooLargeError, match=re.escape(
            f"build_package('rollout'): the package is {probe.unzipped_bytes / 2**20:.1f} MB unzipped, over "
            "Lambda's 1 MB limit; remove requirements from --requirements")):
        build_package(deps, tmp_path / "x.zip", what="rollout", source_dir=source_snapshot,
                      unzipped_limit=2**20)
    with pytest.raises(PackageTooLargeError, match=re.escape(
            f"build_package('rollout'): the package is {probe.zipped_bytes / 2**20:.1f} MB zipped, over "
            f"Lambda's {(probe.zipped_bytes - 1) / 2**20:g} MB limit for a zip package")):
        build_package(deps, tmp_path / "y.zip", what="rollout", source_dir=source_snapshot,
                      zipped_limit=probe.zipped_bytes - 1)
    assert not (tmp_path / "y.zip").exists()  # a refused zip is not left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deps", "probe.zip", "probe.zip.json"]


def test_a_missing_source_package_is_named(tmp_path: Path) -> None:
    with pytest.raises(PackageError, match=re.escape("is not a Python package; point --source-dir at the folder")):
        build_package(tmp_path, tmp_path / "z.zip", what="rollout", source_dir=tmp_path)
