"""A stage is a name by the identifier rule (narrowed for S3), every path built from one stays inside its root, an
unknown stage is an error, and an option that does nothing in its combination is refused: one line, exit 2."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from device._names import is_identifier
from infra._deploy import build_dir, rollback_plan
from infra._errors import DeployConfigError
from infra._iot import credentials_path
from infra._models import check_stage
from infra._state import StateStore
from tests._cli import run_strata
from tests._services import MotoServer
from tests.infra.test_cli import flags

BAD = ["", "../x", "..", "a/b", "Dev", "dev_1", "dev.1", "-dev", "x" * 21, "dev\n", "x" * 10_000]


@pytest.mark.parametrize("stage", BAD)
def test_a_bad_stage_builds_no_path_and_names_no_resource(stage: str, tmp_path: Path) -> None:
    message = re.escape(f"--stage={stage[:77]!r}"[:40])
    for build in (lambda: StateStore(tmp_path, stage), lambda: build_dir(tmp_path, stage), lambda: check_stage(stage),
                  lambda: rollback_plan(stage, state_dir=tmp_path)):
        with pytest.raises(DeployConfigError, match=message if len(stage) < 60 else "is not a valid stage name"):
            build()
    if not is_identifier(stage):  # the path builder's own guard: the identifier rule, then inside()
        with pytest.raises(Exception, match=r"stage must be 1-64 letters|leads outside"):
            credentials_path(tmp_path, stage, "n1")


def test_every_stage_name_is_an_identifier_too() -> None:
    for stage in ("dev", "prod-2", "a", "x" * 20, "0dev"):
        assert check_stage(stage) == stage and is_identifier(stage)


def test_paths_from_a_stage_and_a_node_stay_inside_the_state_folder(tmp_path: Path) -> None:
    assert credentials_path(tmp_path, "dev", "n1") == (tmp_path / "dev" / "iot" / "n1" / "credentials.json").resolve()
    with pytest.raises(Exception, match="node must be 1-64 letters"):
        credentials_path(tmp_path, "dev", "../../../etc")
    (tmp_path / "dev").symlink_to(tmp_path.parent)  # a planted link out of the state folder is refused too
    with pytest.raises(Exception, match="leads outside"):
        build_dir(tmp_path, "dev")


def one_error_line(r: object, start: str) -> None:
    stderr = r.stderr  # type: ignore[attr-defined]
    assert r.returncode == 2, stderr  # type: ignore[attr-defined]
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith(start), stderr


@pytest.mark.parametrize("command", [["plan"], ["apply"], ["destroy", "--yes"], ["rollback", "--yes"],
                                     ["template", "--out", "t.json"]])
@pytest.mark.parametrize("stage", ["", "../x", "Prod"])
def test_the_cli_refuses_a_bad_stage_before_it_reads_or_writes_anything(
        aws_env: MotoServer, tmp_path: Path, command: list[str], stage: str) -> None:
    outside = tmp_path / "x.json"  # what `--stage ../x` would have read under state/
    outside.write_text(json.dumps({"schema_version": 1, "stage": "../x", "config": {}, "resources": {}}))
    state = tmp_path / "state"
    extra = [] if command[0] == "template" else ["--state-dir", str(state)]
    r = run_strata("infra", *command, "--stage", stage, *extra, cwd=tmp_path)
    one_error_line(r, f"strata infra {command[0]}: error: --stage {stage!r}: must be a stage name: 1-20 lowercase "
                      "letters, digits or '-'")
    assert not state.exists() and not (tmp_path / "t.json").exists()


def test_functions_serve_refuses_options_that_do_nothing_and_unknown_stages(aws_env: MotoServer,
                                                                            tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path)}
    r = run_strata("functions", "serve", "--port", "0", "--stage", "dev", env=env)
    one_error_line(r, "strata functions serve: error: --stage 'dev' names a deployed stage and does nothing without "
                      "--from-endpoint URL")
    r = run_strata("functions", "serve", "--port", "0", "--from-endpoint", aws_env.url, "--function",
                   "f=functions._handlers.ping_handler", env=env)
    one_error_line(r, "strata functions serve: error: --function 'f=functions._handlers.ping_handler' does nothing "
                      "with --from-endpoint")
    for stage in ("../x", "", "a/b"):
        r = run_strata("functions", "serve", "--port", "0", "--from-endpoint", aws_env.url, "--stage", stage, env=env)
        one_error_line(r, f"strata functions serve: error: --stage {stage!r}: must be a stage name")
    r = run_strata("functions", "serve", "--port", "0", "--from-endpoint", aws_env.url, "--stage", "Dev", env=env)
    one_error_line(r, "strata functions serve: error: --stage 'Dev': must be a stage name")
    # A stage that is not deployed at the endpoint: an error, not a server with no functions.
    r = run_strata("functions", "serve", "--port", "0", "--from-endpoint", aws_env.url, "--stage", "nope", env=env)
    one_error_line(r, f"strata functions serve: error: functions serve --from-endpoint '{aws_env.url}': stage "
                      "'nope' has no functions there; deploy it with `strata infra apply --stage nope`")
    assert list(tmp_path.iterdir()) == []  # no unpacked-deployment folder left behind


@pytest.mark.parametrize("value", ["0", "-3"])
def test_functions_serve_refuses_an_account_concurrency_that_throttles_everything(value: str) -> None:
    r = run_strata("functions", "serve", "--port", "0", "--account-concurrency", value)
    one_error_line(r, f"strata functions serve: error: --account-concurrency '{value}': must be an integer from 1 to")


def test_an_alias_to_a_missing_version_is_refused_at_start() -> None:
    r = run_strata("functions", "serve", "--port", "0", "--function",
                   "f=functions._handlers.ping_handler,versions=1,alias=live:2")
    one_error_line(r, "strata functions serve: error: FunctionSpec('f'): alias 'live' points at version '2', which is "
                      "not published (versions: 1)")


def test_rollback_of_a_stage_never_applied_is_an_error(aws_env: MotoServer, tmp_path: Path) -> None:
    r = run_strata("infra", "rollback", "--stage", "ghost", "--state-dir", str(tmp_path / "state"), "--yes")
    one_error_line(r, "strata infra rollback: error: rollback: stage 'ghost' has no recorded aliases")


def test_infra_plan_with_an_empty_stage_is_refused_not_read_as_dev(aws_env: MotoServer, tmp_path: Path,
                                                                    cache_dir: Path, source_snapshot: Path) -> None:
    state = tmp_path / "state"
    assert run_strata("infra", "apply", *flags(state, cache_dir, source_snapshot)[2:], "--stage", "dev").returncode == 0
    r = run_strata("infra", "plan", "--stage", "", "--state-dir", str(state))
    one_error_line(r, "strata infra plan: error: --stage '': must be a stage name")
    assert sorted(os.listdir(state)) == ["dev", "dev.json"]
