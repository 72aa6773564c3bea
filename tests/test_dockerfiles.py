"""The images' Dockerfiles (docker/*.Dockerfile), linted: no container runtime here can build them.

Every COPY names a file or folder of the repository, every RUN runs commands the base image has or scripts the
repository ships, the variables they set are the ones scripts/setup.sh reads, the extras exist, the user is the
non-root uid the Kubernetes manifests run as, and the manifests' images are these images.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

from infra._k8s import K8sConfig, Names

REPO = Path(__file__).resolve().parent.parent
DOCKERFILES = sorted((REPO / "docker").glob("*.Dockerfile"))
BASE_IMAGE = "python:3.11.7-slim-bookworm"
# commands a Debian slim Python image has (coreutils, passwd, the shell's builtins, Python)
BASE_COMMANDS = {"test", "echo", "exit", "rm", "mkdir", "chown", "chmod", "groupadd", "useradd", "python", "python3",
                 "pip", "true", "{", "}"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        word, _, rest = pending.partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, f"{path.name}: a continuation line ends the file"
    return out


def test_there_is_an_image_per_role() -> None:
    assert [p.stem for p in DOCKERFILES] == ["cloud", "edge", "env"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_every_copy_and_run_refers_to_what_exists(path: Path) -> None:
    steps = instructions(path)
    assert steps[0] == ("FROM", BASE_IMAGE)
    setup = (REPO / "scripts" / "setup.sh").read_text()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    copied: set[str] = set()
    for word, args in steps:
        assert word in {"FROM", "ARG", "ENV", "WORKDIR", "COPY", "RUN", "USER", "CMD", "EXPOSE"}, word
        if word == "COPY":
            *sources, _ = shlex.split(args)
            for source in sources:
                assert (REPO / source).exists(), f"{path.name}: COPY {source}: no such file in the repository"
                copied.add(source)
        if word == "ENV":
            for name, value in re.findall(r"(STRATA_\w+)=(\S+)", args):
                assert name in setup, f"{path.name}: {name} is not read by scripts/setup.sh"
                if name == "STRATA_EXTRAS":
                    assert set(value.split(",")) <= set(extras), f"{path.name}: unknown extra in {value}"
        if word == "RUN":
            for command in re.split(r"&&|\|\||;", args):
                words = shlex.split(command.replace("{", " { ").replace("}", " } "))
                words = [w for w in words if not re.fullmatch(r"\w+=\S*", w)]  # VAR=value prefixes
                if not words:
                    continue
                program = words[0]
                if "/" in program:
                    script = REPO / program
                    assert script.is_file() and script.stat().st_mode & 0o111, f"{path.name}: RUN {program}"
                    assert program in copied, f"{path.name}: RUN {program} before it is copied"
                else:
                    assert program in BASE_COMMANDS, f"{path.name}: RUN {program}: not in the base image"
    user = dict(steps)["USER"]
    assert user == f"{Names(K8sConfig()).uid}:{Names(K8sConfig()).uid}"  # the uid the manifests run as
    # the project's own install needs these, and the wheel packages every tier
    assert {"pyproject.toml", "README.md", "scripts/setup.sh", "cloud", "device", "edge", "functions",
            "infra"} <= copied
    cmd = dict(steps)["CMD"]
    assert cmd.startswith('["strata"')


def test_the_manifests_run_these_images() -> None:
    config = K8sConfig()
    stems = {p.stem for p in DOCKERFILES}
    for image in (config.cloud_image, config.env_image):
        assert image.split(":")[0].removeprefix("strata-") in stems


def test_the_image_install_path_is_the_setup_script() -> None:
    """The images install through scripts/setup.sh: its image switches exist and default to the developer setup."""
    setup = (REPO / "scripts" / "setup.sh").read_text()
    for name, default in (("STRATA_EXTRAS", "all,dev"), ("STRATA_EDITABLE", "1"), ("STRATA_BROKER", "install")):
        assert f"${{{name}:-{default}}}" in setup
    assert "STRATA_TORCH_INDEX" in setup
