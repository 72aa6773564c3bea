"""The ``edge`` mode end to end on real Mosquitto: fleet experience enters the learner exactly once, through kill -9s.

Agents are real `strata edge run` processes; the learner is `cloud.runs.train` (in this process, or `strata train`
when the learner itself is killed). The checks (`tests.cloud._fleet.check_exactly_once`) read the final
checkpoint's record ids and counters, the spool and every node's outbox: each record a node made was learned
from once, or is still waiting (spool or outbox); none twice, none lost.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from cloud.learners._ppo_config import PPOConfig
from cloud.rollout._edge import EdgeSourceConfig, RecordIds
from cloud.runs._checkpoint import latest_checkpoint, load_checkpoint
from cloud.runs._train import train
from cloud.switching._modes import SwitchingConfig
from device import generate_keypair
from functions._lifetime import child_environment
from tests._cli import run_strata
from tests.cloud._fleet import check_exactly_once, fleet, ingester_pids, kill9_ingesters
from tests.conftest import MosquittoFactory
from tests.edge._agents import wait_until

STEPS = 16
"""num_steps of these runs, so the steps of one experience record (the learner asks for it in its bundles)."""
UPDATES = 20


def _updates(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return sum(1 for line in path.read_text().splitlines() if '"policy_version"' in line) if path.exists() else 0


def _config() -> PPOConfig:
    return PPOConfig(num_envs=4, num_steps=STEPS, clip_vloss=False, learning_rate=1.5e-3)


def test_record_ids_are_kept_as_intervals() -> None:
    ids = RecordIds()
    for rid in (5, 3, 4, 9, 1, 10, 4):
        ids.add("n1", rid)
    ids.add("n2", 7)
    assert ids.intervals() == {"n1": [[1, 1], [3, 5], [9, 10]], "n2": [[7, 7]]}
    assert ("n1", 4) in ids and ("n1", 2) not in ids and ("n3", 1) not in ids and ids.count() == 7
    ids.add("n1", 2)
    assert RecordIds(ids.intervals()).intervals()["n1"] == [[1, 5], [9, 10]]


@pytest.mark.timeout(600)
def test_every_fleet_transition_enters_the_learner_exactly_once_through_kill_9s(mosquitto_factory: MosquittoFactory,
                                                                               tmp_path: Path) -> None:
    broker = mosquitto_factory(["persistence true", "max_queued_messages 100000"])
    run_dir = tmp_path / "run"
    _, pub = generate_keypair(run_dir / "keys")  # the run signs with it; the nodes trust it
    spool = run_dir / "edge" / "spool.sqlite"
    kills: list[str] = []
    logs: list[str] = []

    with fleet(tmp_path, 3, broker=broker.url, fleet_name="once", trust=pub) as agents:
        def chaos() -> None:
            wait_until(lambda: _updates(run_dir) >= 3, timeout=300, what="three updates")
            agents[0].kill9()
            kills.append("agent")
            wait_until(lambda: _updates(run_dir) >= 8, timeout=300, what="eight updates")
            kills.append(f"ingester x{kill9_ingesters(spool)}")
            wait_until(lambda: _updates(run_dir) >= 13, timeout=300, what="thirteen updates")
            broker.kill()
            broker.start()
            kills.append("broker")

        killer = threading.Thread(target=chaos, daemon=True)
        killer.start()
        result = train(env_id="CartPole-v1", total_steps=UPDATES * 4 * STEPS, run_dir=run_dir, seed=0, config=_config(),
                       switching=SwitchingConfig(modes=("edge",), control=False), progress=False, log=logs.append,
                       edge=EdgeSourceConfig(edge_broker=broker.url, edge_fleet="once", edge_max_staleness=10**6,
                                             edge_wait_s=120))
        killer.join(timeout=60)
    assert kills == ["agent", "ingester x1", "broker"]
    assert result.accounting is not None
    assert (result.accounting["duplicates"], result.accounting["gaps"]) == (0, 0)  # transition ids in this process
    state = load_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    figures = check_exactly_once(state, spool=spool, agents=agents, steps=STEPS)
    assert figures["records"] == UPDATES * 4 and result.global_step == UPDATES * 4 * STEPS
    assert state["edge"]["counters"]["ingester_restarts"] >= 1
    assert any("restarting it" in line for line in logs)


@pytest.mark.timeout(600)
def test_strata_switch_moves_a_live_run_to_the_fleet_and_back_and_status_shows_the_fleet(
        mosquitto_factory: MosquittoFactory, tmp_path: Path) -> None:
    from cloud.switching._control import ControlClient

    broker = mosquitto_factory()
    run_dir = tmp_path / "run"
    _, pub = generate_keypair(run_dir / "keys")
    seen: dict[str, object] = {}

    with fleet(tmp_path, 2, broker=broker.url, fleet_name="switch", trust=pub):
        def operator() -> None:
            wait_until(lambda: _updates(run_dir) >= 3, timeout=300, what="three updates")
            at = int(ControlClient.for_run(run_dir).switch("edge", timeout=300)["at_version"])
            wait_until(lambda: _updates(run_dir) >= at + 2, timeout=300, what="two updates from the fleet")
            seen["status"] = run_strata("status", str(run_dir), timeout=120).stdout  # the run is in edge mode
            seen["back"] = ControlClient.for_run(run_dir).switch("colocated", timeout=300)

        thread = threading.Thread(target=operator, daemon=True)
        thread.start()
        result = train(env_id="CartPole-v1", total_steps=80 * 4 * STEPS, run_dir=run_dir, seed=0, config=_config(),
                       switching=SwitchingConfig(modes=("colocated", "edge")), progress=False, log=lambda line: None,
                       edge=EdgeSourceConfig(edge_broker=broker.url, edge_fleet="switch", edge_wait_s=120))
        thread.join(timeout=60)
    assert [(e.from_mode, e.to_mode, e.trigger) for e in result.switches] == [("colocated", "edge", "manual"),
                                                                            ("edge", "colocated", "manual")]
    assert result.accounting is not None and (result.accounting["duplicates"], result.accounting["gaps"]) == (0, 0)
    status = str(seen["status"])
    assert "edge records" in status and "edge duplicates" in status and "  node n" in status, status
    state = load_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    assert 1 <= int(state["edge"]["counters"]["records"]) < 80 * 4  # some updates from the fleet, some co-located


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_learner_killed_with_sigkill_resumes_and_learns_each_record_once(mosquitto_factory: MosquittoFactory,
                                                                          tmp_path: Path) -> None:
    broker = mosquitto_factory(["persistence true", "max_queued_messages 100000"])
    run_dir = tmp_path / "run"
    _, pub = generate_keypair(run_dir / "keys")
    spool = run_dir / "edge" / "spool.sqlite"
    args = ["train", "--env", "CartPole-v1", "--run-dir", str(run_dir), "--total-steps", str(40 * 4 * STEPS),
            "--num-envs", "4", "--num-steps", str(STEPS), "--modes", "edge", "--edge-broker", broker.url,
            "--edge-fleet", "resume", "--edge-max-staleness", "1000000", "--rolling-checkpoint-s", "0",
            "--confirm-episodes", "0", "--no-control", "--edge-wait-s", "120"]
    with fleet(tmp_path, 2, broker=broker.url, fleet_name="resume", trust=pub) as agents:
        learner = subprocess.Popen([sys.executable, "-m", "cloud.cli", *args], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env=child_environment())
        try:
            wait_until(lambda: _updates(run_dir) >= 12, timeout=300, what="twelve updates")
            learner.send_signal(signal.SIGKILL)
            assert learner.wait(30) == -signal.SIGKILL
            wait_until(lambda: not ingester_pids(spool), timeout=60, what="the ingesters to follow their learner")
        finally:
            if learner.poll() is None:
                learner.kill()
                learner.wait()
        resumed = run_strata(*args, "--resume", timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-2000:]
    state = load_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    figures = check_exactly_once(state, spool=spool, agents=agents, steps=STEPS)
    assert figures["records"] == 40 * 4
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    versions = [m["policy_version"] for m in metrics if "losses/pg_loss" in m]
    assert versions == list(range(1, 41))  # the resumed run continued the lineage without a gap or a repeat


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_learner_on_fleet_experience_alone_solves_cartpole_through_kill_9s(mosquitto_factory: MosquittoFactory,
                                                                            tmp_path: Path) -> None:
    broker = mosquitto_factory(["persistence true", "max_queued_messages 100000"])
    run_dir = tmp_path / "run"
    _, pub = generate_keypair(run_dir / "keys")
    spool = run_dir / "edge" / "spool.sqlite"
    kills: list[str] = []
    # A budget near what the learner takes: unbudgeted, four nodes send several times more, which goes stale.
    with fleet(tmp_path, 4, broker=broker.url, fleet_name="solve", trust=pub, steps_per_s=400) as agents:
        def chaos() -> None:
            wait_until(lambda: _updates(run_dir) >= 10, timeout=600, what="ten updates")
            agents[1].kill9()
            kills.append("agent")
            wait_until(lambda: _updates(run_dir) >= 25, timeout=600, what="25 updates")
            kills.append(f"ingester x{kill9_ingesters(spool)}")
            wait_until(lambda: _updates(run_dir) >= 40, timeout=600, what="40 updates")
            broker.kill()
            broker.start()
            kills.append("broker")

        killer = threading.Thread(target=chaos, daemon=True)
        killer.start()
        result = train(env_id="CartPole-v1", total_steps=150_000, run_dir=run_dir, seed=0,
                       config=PPOConfig(clip_vloss=False, learning_rate=1.5e-3), target_return=475.0,
                       confirm_episodes=20, switching=SwitchingConfig(modes=("edge",), control=False), progress=False,
                       log=lambda line: None, edge=EdgeSourceConfig(edge_broker=broker.url, edge_fleet="solve",
                                                                    edge_wait_s=300))
        killer.join(timeout=600)
    assert kills == ["agent", "ingester x1", "broker"]
    assert result.solved_at_step is not None and result.greedy_return is not None and result.greedy_return >= 475
    assert result.accounting is not None and (result.accounting["duplicates"], result.accounting["gaps"]) == (0, 0)
    state = load_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    check_exactly_once(state, spool=spool, agents=agents, steps=32)


@pytest.mark.timeout(600)
def test_sac_learns_from_the_fleet_into_its_replay_with_each_transitions_version(mosquitto_factory: MosquittoFactory,
                                                                                 tmp_path: Path) -> None:
    broker = mosquitto_factory(["persistence true"])
    run_dir = tmp_path / "run"
    _, pub = generate_keypair(run_dir / "keys")
    args = ["train", "--algo", "sac", "--env", "Pendulum-v1", "--env-mode", "edge", "--edge-broker", broker.url,
            "--edge-fleet", "sac", "--edge-wait-s", "120", "--run-dir", str(run_dir), "--total-steps", "500",
            "--learning-starts", "250", "--batch-size", "32", "--log-every", "250", "--eval-episodes", "1",
            "--hidden-sizes", "32", "32"]
    with fleet(tmp_path, 2, broker=broker.url, fleet_name="sac", trust=pub, env="Pendulum-v1") as agents:
        got = run_strata(*args, timeout=600)
    assert got.returncode == 0, got.stderr[-2000:]
    state = load_checkpoint(latest_checkpoint(run_dir))  # type: ignore[arg-type]
    figures = check_exactly_once(state, spool=run_dir / "edge" / "spool.sqlite", agents=agents, steps=250)
    assert figures["records"] == 500 // 250  # records of a divisor of log_every: a commit never splits one
    versions = state["replay"]["version"][:500]
    assert int(versions.min()) >= 1 and int(versions.max()) <= 2  # bundle versions 1 + commits, per transition
    assert (run_dir / "policy.onnx").exists()


def test_edge_flags_are_checked_before_any_work(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cases = [
        (["--modes", "edge"], "mode edge needs --edge-broker mqtt://HOST:PORT and --edge-fleet NAME"),
        (["--modes", "colocated", "--edge-broker", "mqtt://127.0.0.1:1"], "--edge-broker configure the edge mode"),
        (["--modes", "edge", "--edge-broker", "ftp://x", "--edge-fleet", "f"], "is not of the form mqtt://host:port"),
        (["--modes", "edge", "--edge-broker", "mqtt://127.0.0.1:1", "--edge-fleet", "a/b"], "cannot be an MQTT topic"),
        (["--modes", "edge", "--edge-broker", "mqtt://127.0.0.1:1", "--edge-fleet", "f", "--edge-ingesters", "0"],
         "edge_ingesters=0"),
        (["--modes", "edge", "--edge-broker", "mqtt://127.0.0.1:1", "--edge-fleet", "f", "--edge-password-file",
          str(tmp_path / "missing")], "--edge-password-file"),
        (["--algo", "sac", "--env", "Pendulum-v1", "--edge-fleet", "f"], "give --env-mode edge (SAC) or drop them"),
        (["--algo", "sac", "--env", "Pendulum-v1", "--env-mode", "edge"], "mode edge needs --edge-broker"),
    ]
    for flags, message in cases:
        env = ["--env", "CartPole-v1"] if "--env" not in flags else []
        got = run_strata("train", *env, "--run-dir", str(run_dir), "--total-steps", "1000", *flags, timeout=120)
        assert got.returncode == 2, (flags, got.stderr)
        assert message in got.stderr and "Traceback" not in got.stderr, (flags, got.stderr)
        assert len(got.stderr.strip().splitlines()) == 1, got.stderr
        assert not run_dir.exists()  # nothing left behind


def test_strata_edge_ingest_refuses_bad_flags_in_one_line(tmp_path: Path) -> None:
    spaces = tmp_path / "spaces.json"
    spaces.write_text("{not json")
    cases = [([], "--broker, --fleet, --spool, --spaces required"),
             (["--broker", "mqtt://127.0.0.1:1", "--fleet", "f", "--spool", str(tmp_path / "s.sqlite"), "--spaces",
               str(spaces)], "is not a spaces file written by the learner"),
             (["--broker", "mqtt://127.0.0.1:1", "--fleet", "f/x", "--spool", "s", "--spaces", "x"],
              "cannot be an MQTT topic segment"),
             (["--broker", "mqtt://127.0.0.1:1", "--fleet", "f", "--spool", "s", "--spaces", str(spaces),
               "--batch-s", "0"], "batch_s=0.0 must lie in (0, 10]")]
    for flags, message in cases:
        got = run_strata("edge", "ingest", *flags, timeout=120)
        assert got.returncode == 2 and message in got.stderr and "Traceback" not in got.stderr, (flags, got.stderr)
