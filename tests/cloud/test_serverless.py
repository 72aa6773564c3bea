"""The serverless rollout source over the local function runtime (real boto3, real awslambdaric workers)."""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterator

import numpy as np
import pytest

from cloud.rollout._serverless import (
    PRICE_PER_GB_S,
    PRICE_PER_REQUEST,
    Autoscaler,
    LocalRuntimeProcess,
    ServerlessConfig,
    ServerlessError,
    ServerlessRolloutSource,
    ServerlessStats,
    local_scaling,
    make_serverless_source,
)
from device import RolloutBatch
from functions._lambda_api import FunctionSpec
from functions._runtime import FaultConfig, LocalRuntime, RuntimeConfig, SourceTreeFunctions
from tests._services import MotoServer

ROLLOUT = "functions._handlers.rollout_handler"


@pytest.fixture
def creds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def start_runtime(faults: FaultConfig, *, concurrency: int = 3, timeout_s: float = 30.0) -> LocalRuntime:
    spec = FunctionSpec(name="strata-rollout", handler=ROLLOUT, reserved_concurrency=concurrency, timeout_s=timeout_s)
    return LocalRuntime(SourceTreeFunctions([spec]), config=RuntimeConfig(port=0, async_retry_delay_s=0.05),
                        faults=faults).start()


@pytest.fixture
def runtime_factory() -> Iterator[list[LocalRuntime]]:
    started: list[LocalRuntime] = []
    yield started
    for rt in started:
        rt.stop()


def config(url: str, **kw: object) -> ServerlessConfig:
    base = ServerlessConfig(lambda_endpoint_url=url, envs_per_invocation=2, steps_per_invocation=20,
                            fragment_length=10, max_concurrency=3, target_steps_per_s=1e9, seed=5)
    return local_scaling(dataclasses.replace(base, **kw))  # type: ignore[arg-type]


def assert_exactly_once(batches: list[RolloutBatch], rollouts: int, cfg: ServerlessConfig) -> None:
    """Every transition once: per worker (a lane's stream) the seqs run 0..n-1 without a gap, and none is missing."""
    ids = Counter(tid for b in batches for tid in b.transition_ids())
    assert max(ids.values()) == 1, "a transition was counted twice"
    per_worker: dict[int, set[int]] = defaultdict(set)
    for source, w, s in ids:
        assert source == cfg.source
        per_worker[w].add(s)
    for w, seqs in per_worker.items():
        assert seqs == set(range(len(seqs))), f"worker {w} has a gap: a transition was lost"
        assert len(seqs) % cfg.steps_per_invocation == 0
    assert len(ids) == rollouts * cfg.envs_per_invocation * cfg.steps_per_invocation, "a transition was lost"


def test_throttles_and_service_errors_lose_nothing_and_count_nothing_twice(creds: None,
                                                                           runtime_factory: list[LocalRuntime]) -> None:
    rt = start_runtime(FaultConfig(throttle_rate=0.3, service_error_rate=0.1, seed=1))
    runtime_factory.append(rt)
    cfg = config(rt.url)
    with ServerlessRolloutSource(cfg) as source:
        source.invoker._sleep = lambda s: None  # backoff is tested in infra; keep this test fast
        batches = list(source.fragments(count=16))
        assert len(batches) == 16
        assert_exactly_once(batches, 8, cfg)
        assert source.stats.attempts > source.stats.invocations  # the injected faults were retried
        assert source.stats.rollouts == 8 and source.stats.transitions == 8 * 40
    assert rt.stats["strata-rollout"].throttles > 0


def test_crashed_workers_are_reissued_under_the_same_rollout_id(creds: None,
                                                                runtime_factory: list[LocalRuntime]) -> None:
    rt = start_runtime(FaultConfig(crash_rate=0.3, seed=4))
    runtime_factory.append(rt)
    cfg = config(rt.url, max_reissues=10)
    with ServerlessRolloutSource(cfg) as source:
        batches = list(source.fragments(count=12))
        assert_exactly_once(batches, 6, cfg)
        assert source.stats.reissued > 0 and source.stats.function_errors == source.stats.reissued


def test_async_duplicate_deliveries_are_dropped_by_rollout_id(aws_env: MotoServer,
                                                               runtime_factory: list[LocalRuntime]) -> None:
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="rollouts")
    rt = start_runtime(FaultConfig(duplicate_rate=1.0, seed=2))  # every Event is delivered twice
    runtime_factory.append(rt)
    cfg = config(rt.url, invocation="async", result_bucket="rollouts", async_poll_s=0.02)
    with ServerlessRolloutSource(cfg) as source:
        batches = list(source.fragments(count=8))
        assert_exactly_once(batches, 4, cfg)
        stats = rt.stats["strata-rollout"]
    assert stats.duplicates_injected == 4
    # every rollout id ran twice and both results reached S3, yet each transition was yielded once
    s3 = boto3.client("s3", region_name="us-east-1")
    deadline = time.monotonic() + 60
    while True:
        listing = s3.list_objects_v2(Bucket="rollouts", Prefix="strata-rollouts/")
        markers = [o["Key"] for o in listing["Contents"] if o["Key"].endswith(".json")]
        if len(markers) == 8 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(markers) == 8 and len({m.split("/")[1] for m in markers}) == 4


def test_a_refused_rollout_raises_with_the_functions_reason(creds: None, runtime_factory: list[LocalRuntime]) -> None:
    rt = start_runtime(FaultConfig())
    runtime_factory.append(rt)
    with ServerlessRolloutSource(config(rt.url, env_id="NoSuchEnv-v0")) as source, pytest.raises(
            ServerlessError, match=re.escape("refused the rollout: SimulationError: make_envs: gymnasium.make(")):
        list(source.fragments(count=1))


def test_make_serverless_source_local_starts_and_stops_its_own_runtime(creds: None) -> None:
    cfg = ServerlessConfig(envs_per_invocation=2, steps_per_invocation=8, max_concurrency=2)
    source = make_serverless_source("local", cfg)
    runtime = source._owned[0]
    assert isinstance(runtime, LocalRuntimeProcess) and source.config.lambda_endpoint_url == runtime.url
    try:
        batches = list(source.fragments(count=3))
        assert [b.num_steps for b in batches] == [8, 8, 8]
        assert source.config.scale_step == 2 and source.stats.cost_usd() > 0
        assert source.stats.summary()["transitions"] == 48
    finally:
        source.close()
    assert runtime.proc.returncode == 0 and source._owned == []


def test_the_config_is_cli_ready() -> None:
    import argparse

    from device import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser, ServerlessConfig)
    args = parser.parse_args(["--invocation", "async", "--result-bucket", "b", "--max-concurrency", "16"])
    cfg = config_from_args(ServerlessConfig, args)
    assert (cfg.invocation, cfg.result_bucket, cfg.max_concurrency) == ("async", "b", 16)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_autoscaler_derives_concurrency_from_demand_and_ramps() -> None:
    clock = FakeClock()
    cfg = ServerlessConfig(target_steps_per_s=100_000, max_concurrency=5000, scale_step=1000, scale_period_s=10,
                           prior_steps_per_s=10_000)
    scaler = Autoscaler(cfg, clock=clock)
    assert scaler.desired() == 10  # 100k / 10k per invocation
    scaler.observe(steps=2000, invoke_s=1.0, handler_s=0.99)  # an invocation is slower than assumed: 2k steps/s
    assert scaler.desired() == 50
    fast = Autoscaler(dataclasses.replace(cfg, target_steps_per_s=1e8), clock=clock)
    assert fast.desired() == 1000  # Lambda's ramp: +1000 environments per 10 s
    clock.t = 10.0
    assert fast.desired() == 2000
    clock.t = 45.0
    assert fast.desired() == 5000  # capped by max_concurrency


def test_autoscaler_skips_scaling_up_when_cold_starts_would_not_pay_off() -> None:
    cfg = ServerlessConfig(target_steps_per_s=1e6, max_concurrency=100, scale_step=100, prior_steps_per_s=1000,
                           cold_start_s=2.0, min_concurrency=2, steps_per_invocation=100, envs_per_invocation=10)
    scaler = Autoscaler(cfg, clock=FakeClock())
    # 2 in flight at 1000 steps/s each finish 3000 steps in 1.5 s, sooner than a 2 s cold start
    assert scaler.desired(remaining_steps=3000) == 2
    assert scaler.desired(remaining_steps=1_000_000) == 100


def test_autoscaler_learns_the_cold_start_cost() -> None:
    scaler = Autoscaler(ServerlessConfig(cold_start_s=1.0), clock=FakeClock())
    scaler.observe(steps=100, invoke_s=0.011, handler_s=0.010)
    scaler.observe(steps=100, invoke_s=0.511, handler_s=0.010)  # 0.5 s of overhead: a cold start
    assert scaler.cold_start_s == pytest.approx(0.5 * 1.0 + 0.5 * 0.501)
    assert scaler.per_invocation_steps_per_s == pytest.approx(100 / 0.011)


def test_cost_estimate_uses_documented_prices() -> None:
    stats = ServerlessStats(invocations=1_000_000, gb_seconds=400_000, transitions=2_000_000_000)
    assert PRICE_PER_GB_S == 0.0000166667 and PRICE_PER_REQUEST == 0.20 / 1_000_000
    assert stats.cost_usd() == pytest.approx(400_000 * 0.0000166667 + 0.20)
    assert stats.summary()["cost_usd_per_million_steps"] == pytest.approx(stats.cost_usd() / 2000)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min_concurrency": 4, "max_concurrency": 2}, "need 1 <= min_concurrency <= max_concurrency, got 4 and 2"),
    ({"invocation": "async"}, "invocation='async' returns results through S3; set result_bucket"),
    ({"env_kwargs": "[1]"}, "env_kwargs must be a JSON object, got '[1]'"),
])
def test_bad_configs_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ServerlessError, match=re.escape(message)):
        ServerlessConfig(**kwargs)  # type: ignore[arg-type]


def test_a_signed_bundle_is_verified_and_run_inside_the_function(creds: None, tmp_path: object,
                                                                 runtime_factory: list[LocalRuntime]) -> None:
    from pathlib import Path

    from device import build_bundle, generate_keypair, load_signing_key
    from tests.device._models import mlp_policy

    key_path, pub_path = generate_keypair(Path(str(tmp_path)))
    spec = FunctionSpec(name="strata-rollout", handler=ROLLOUT, reserved_concurrency=2,
                        environment={"STRATA_TRUSTED_KEYS": pub_path.read_text()})
    rt = LocalRuntime(SourceTreeFunctions([spec]), config=RuntimeConfig(port=0)).start()
    runtime_factory.append(rt)
    obs = {"type": "Box", "shape": [4], "dtype": "float32", "low": ["-inf"] * 4, "high": ["inf"] * 4}
    bundle = build_bundle(mlp_policy(hidden=(8,)), policy="cartpole", version=7, parent_version=6,
                          observation_space=obs, action_space={"type": "Discrete", "n": 2},
                          signing_key=load_signing_key(key_path), output_names=("action", "logits")).to_bytes()
    with ServerlessRolloutSource(config(rt.url, max_concurrency=2)) as source:
        assert source.set_policy(bundle) == 7
        batches = list(source.fragments(count=4))
        assert all((b.policy_version == 7).all() for b in batches)
        assert_exactly_once(batches, 2, source.config)
        source.set_policy(build_bundle(b"not onnx", policy="cartpole", version=8, parent_version=7,
                                       observation_space=obs, action_space={"type": "Discrete", "n": 2},
                                       signing_key=None).to_bytes())
        with pytest.raises(ServerlessError, match=re.escape("refused the rollout: UnsignedBundleError")):
            list(source.fragments(count=1))


def test_the_source_ramps_within_the_local_scaling_rule_and_follows_demand(
        creds: None, runtime_factory: list[LocalRuntime]) -> None:
    import math

    # The ramp is read on a clock the test controls: a quarter period passes per fragment received, so the rule
    # is checked exactly, and demand lasts until the cap is reached, however fast the machine steps.
    now = [0.0]
    rt = start_runtime(FaultConfig(), concurrency=6)
    runtime_factory.append(rt)
    cfg = config(rt.url, max_concurrency=6, steps_per_invocation=1000, fragment_length=0)
    with ServerlessRolloutSource(cfg, clock=lambda: now[0]) as src:
        history = src.stats.concurrency
        for received, _ in enumerate(src.fragments(), start=1):  # demand is unbounded ...
            if max(f for _, _, f in history) == 6:
                break  # ... so it reaches the cap
            assert received < 200, "the ramp never reached max_concurrency=6"
            now[0] += cfg.scale_period_s / 4
    assert max(f for _, _, f in history) == 6
    for t, _, in_flight in history:  # ... but never faster than +2 per 0.5 s
        assert in_flight <= 2 * (math.floor(t / 0.5) + 1)
    assert any(in_flight == 2 for _, _, in_flight in history)  # it did start at the first step of the ramp
    with ServerlessRolloutSource(config(rt.url, max_concurrency=6, target_steps_per_s=1.0)) as slow:
        list(slow.fragments(count=6))
        assert max(f for _, _, f in slow.stats.concurrency) == 1  # 1 step/s of demand needs one invocation


# ---- episodes carried across invocations (functions._envstate) ------------------------------------------------

def _streams(batches: list[RolloutBatch]) -> dict[int, dict[str, np.ndarray]]:
    """Each worker's transitions in seq order, stitched across the invocations that produced them."""
    parts: dict[int, list[tuple[int, int, RolloutBatch]]] = defaultdict(list)
    for b in batches:
        for j, w in enumerate(b.worker.tolist()):
            parts[w].append((int(b.seq[0, j]), j, b))
    out = {}
    for w, pieces in parts.items():
        pieces.sort(key=lambda p: p[0])
        out[w] = {name: np.concatenate([getattr(b, name)[:, j] for _, j, b in pieces])
                  for name in ("seq", "obs", "actions", "rewards", "terminations", "truncations", "final_obs")}
    return out


def _one_process(env_id: str, seed: int, actions: np.ndarray, *, obs_size: int = 4) -> dict[str, np.ndarray]:
    import gymnasium as gym

    env = gym.make(env_id)
    o, _ = env.reset(seed=seed)
    out: dict[str, list[object]] = {"obs": [], "rewards": [], "terminations": [], "truncations": [], "final_obs": []}
    for a in actions:
        out["obs"].append(np.asarray(o, np.float32))
        o, r, term, trunc, _ = env.step(int(a))
        out["rewards"].append(np.float32(r))
        out["terminations"].append(term)
        out["truncations"].append(trunc)
        out["final_obs"].append(np.asarray(o, np.float32) if term or trunc else np.zeros(obs_size, np.float32))
        if term or trunc:
            o, _ = env.reset()
    return {k: np.array(v) for k, v in out.items()}


def test_episodes_continue_across_invocations_through_worker_crashes(creds: None,
                                                                     runtime_factory: list[LocalRuntime]) -> None:
    rt = start_runtime(FaultConfig(crash_rate=0.3, seed=4))
    runtime_factory.append(rt)
    cfg = config(rt.url, max_concurrency=2, max_reissues=10)
    with ServerlessRolloutSource(cfg) as source:
        batches = list(source.fragments(count=24))  # 12 invocations on at most 2 lanes of 2 streams
        stats = source.stats
    assert_exactly_once(batches, 12, cfg)
    assert stats.reissued > 0  # workers crashed and their rollouts were re-issued with the same carry
    assert stats.episodes_continued > 0 and stats.carry_bytes_sent > 0 and stats.carry_bytes_received > 0
    streams = _streams(batches)
    assert max(len(s["seq"]) for s in streams.values()) >= 5 * cfg.steps_per_invocation
    longest = 0
    for w, got in streams.items():
        want = _one_process(cfg.env_id, cfg.seed + w, got["actions"])
        for name in ("obs", "rewards", "terminations", "truncations", "final_obs"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"worker {w}: {name} differs")
        ends = np.flatnonzero(got["terminations"] | got["truncations"])
        longest = max([longest, *np.diff(np.concatenate([[-1], ends])).tolist()])
    assert longest > cfg.steps_per_invocation  # an episode outlived the invocation that started it


def test_without_carries_every_rollout_starts_fresh_streams(creds: None, runtime_factory: list[LocalRuntime]) -> None:
    rt = start_runtime(FaultConfig())
    runtime_factory.append(rt)
    cfg = config(rt.url, carry_episodes=False)
    with ServerlessRolloutSource(cfg) as source:
        batches = list(source.fragments(count=8))
        assert source.stats.carry_bytes_sent == 0 and source.stats.episodes_continued == 0
    ids = {tid for b in batches for tid in b.transition_ids()}
    assert ids == {(cfg.source, w, s) for w in range(4 * cfg.envs_per_invocation)
                   for s in range(cfg.steps_per_invocation)}


def test_an_env_without_a_codec_runs_as_before_with_one_note(creds: None, runtime_factory: list[LocalRuntime],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    rt = start_runtime(FaultConfig())
    runtime_factory.append(rt)
    cfg = config(rt.url, env_id="FrozenLake-v1")  # toy-text: no env-state codec
    with caplog.at_level("WARNING", logger="cloud.rollout._serverless"), ServerlessRolloutSource(cfg) as source:
        batches = list(source.fragments(count=8))
        assert source.stats.episodes_continued == 0
    ids = {tid for b in batches for tid in b.transition_ids()}
    assert ids == {(cfg.source, w, s) for w in range(4 * cfg.envs_per_invocation)
                   for s in range(cfg.steps_per_invocation)}  # fresh worker ids, seqs from 0: today's behaviour
    notes = [r.getMessage() for r in caplog.records if r.name == "cloud.rollout._serverless"]
    assert notes == ["FrozenLake-v1: episodes cannot continue across invocations (its FrozenLakeEnv layer has no "
                     "env-state codec), so they end at the fragment length (20 steps per invocation); register a "
                     "codec with functions.register_env_codec (see functions/_envstate.py)"]


def test_an_event_over_the_request_limit_is_refused_before_it_is_sent(creds: None) -> None:
    cfg = ServerlessConfig(lambda_endpoint_url="http://127.0.0.1:9", envs_per_invocation=2)
    with ServerlessRolloutSource(cfg) as source:
        source._issue(0)  # a fresh lane: no carries yet, small
        lane = source._issued.pop(0).lane
        lane.carry = (b"x" * (3 * 1024 * 1024), b"y" * (2 * 1024 * 1024))
        source._idle_lanes.append(lane)
        with pytest.raises(ServerlessError, match=re.escape("over Lambda's 6291456-byte request limit")):
            source._issue(1)


def test_a_users_env_with_a_registered_codec_continues_through_the_runtime(creds: None) -> None:
    from tests.functions._envstate_handler import ENV_ID  # also registers the env in this process, for the replay

    spec = FunctionSpec(name="strata-rollout", handler="tests.functions._envstate_handler.rollout_handler",
                        reserved_concurrency=2)
    with LocalRuntime(SourceTreeFunctions([spec]), config=RuntimeConfig(port=0)) as rt:
        cfg = config(rt.url, env_id=ENV_ID, max_concurrency=2)
        with ServerlessRolloutSource(cfg) as source:
            batches = list(source.fragments(count=16))  # 8 invocations of 20 steps on 2 lanes
            assert source.stats.episodes_continued > 0
    assert_exactly_once(batches, 8, cfg)
    ended = 0
    for w, got in _streams(batches).items():
        want = _one_process(ENV_ID, cfg.seed + w, got["actions"], obs_size=2)
        for name in ("obs", "rewards", "terminations", "final_obs"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"worker {w}: {name} differs")
        ended += int(got["terminations"].sum())
    assert ended >= 1  # 45-step episodes ended in the third invocation of their stream
