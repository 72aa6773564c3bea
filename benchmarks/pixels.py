"""Pixel observations on the wire: bytes and CPU per codec, fragments/s per mode and codec, and a learning check.

Three parts, on CarRacing-v3 (96 x 96 RGB frames, 4 stacked), measured against raw arrays and PNG in the same run:

    codecs     one fragment of T steps of real CarRacing frames (random actions), encoded as a rollout batch with
               each codec: bytes per transition (``bytes_vs_png``: the fraction of PNG's), encode and decode CPU
               per frame, and for lossy codecs the PSNR of the decoded frames (a lossy codec is applied once, by
               the observation pipeline where the frame is made, and the wire then reuses its bytes)
    modes      fragments/s of `FragmentSource` over two env services acting with a (random-weight) CNN bundle
               in onnxruntime (``decoupled``), and of the serverless source over the local function runtime with
               random actions (``functions``), per codec; a result over Lambda's 6 MB is reported as refused
    learning   PPO on CarRacing-v3 for a fixed budget with raw and with the chosen lossy codec, same seeds;
               the training curves go into one matplotlib plot (``--plot``)

    .venv/bin/python benchmarks/pixels.py [--quick] [--parts codecs,modes,learning] [--budget N] [--seeds 0,1]

The last line is JSON; it holds ``bytes_vs_png`` per codec.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ENV = "CarRacing-v3"
STACK = 4
LOSSY = "webp:90"
CODECS = ("raw", "png", "webp", "jxl", "webp:90", "webp:75", "webp:50", "jxl:90", "jxl:75")


def carracing_frames(steps: int, seed: int = 0) -> np.ndarray:
    """``[steps + STACK, 96, 96, 3]`` frames of CarRacing-v3 under random actions (past the opening zoom)."""
    import gymnasium as gym

    env = gym.make(ENV)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    for _ in range(50):  # the first ~50 frames are the camera zooming in
        env.step(np.array([0.0, 0.3, 0.0], np.float32))
    frames = []
    for _ in range(steps + STACK):
        action = np.array([rng.uniform(-1, 1), rng.uniform(0, 1), 0.0], np.float32)
        obs, *_ = env.step(action)
        frames.append(obs)
    env.close()
    return np.stack(frames)


def stacked_batch(frames: np.ndarray) -> Any:
    """A one-stream rollout batch whose observations are the frame stacks of `frames`."""
    from device import RolloutBatch

    t = frames.shape[0] - STACK
    obs = np.stack([frames[i:i + STACK] for i in range(t)])[:, None]
    return RolloutBatch(source="bench", obs=obs, actions=np.zeros((t, 1, 3), np.float32),
                        rewards=np.zeros((t, 1), np.float32), terminations=np.zeros((t, 1), bool),
                        truncations=np.zeros((t, 1), bool), final_obs=np.zeros_like(obs),
                        next_obs=frames[t:t + STACK][None], policy_version=np.zeros((t, 1), np.int64),
                        worker=np.zeros(1, np.int64), seq=np.arange(t, dtype=np.int64)[:, None])


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 arrays, dB (inf when equal)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def measure_codecs(frames: np.ndarray) -> dict[str, dict[str, float]]:
    """Bytes per transition, encode/decode CPU per frame and PSNR of each codec on one fragment of `frames`."""
    from device import ObsCodec, RolloutBatch
    from device._obs_codec import FrameCodec, decode_frame

    out: dict[str, dict[str, float]] = {}
    unique = frames  # every distinct frame of the fragment
    for spec in CODECS:
        codec = ObsCodec.parse(spec)
        coder = FrameCodec(codec)
        seen = frames
        encode_s = decode_s = 0.0
        if codec.lossy:  # what the observation pipeline does where each frame is made
            started = time.process_time()
            seen = np.stack([coder.roundtrip(f) for f in unique])
            encode_s = time.process_time() - started  # encode + one decode per frame
        batch = stacked_batch(seen)
        import device._obs_codec as oc

        oc._codecs[codec.spec] = coder  # the wire reuses the pipeline's blobs, as in a host process
        started = time.process_time()
        data = batch.to_bytes(codec)
        wire_s = time.process_time() - started
        started = time.process_time()
        back = RolloutBatch.from_bytes(data)
        unpack_s = time.process_time() - started
        assert np.array_equal(back.obs, batch.obs), f"{spec}: the wire changed the frames it carried"
        if not codec.is_raw:
            blobs = [coder.blob(f) for f in seen]
            started = time.process_time()
            for blob in blobs:
                decode_frame(blob, tuple(frames.shape[1:]))
            decode_s = (time.process_time() - started) / len(blobs)
            if not codec.lossy:
                encode_s = wire_s
        out[spec] = {"bytes_per_transition": len(data) / batch.size,
                     "encode_ms_per_frame": 1000 * encode_s / len(unique) if not codec.is_raw else 0.0,
                     "decode_ms_per_frame": 1000 * decode_s if not codec.is_raw else 0.0,
                     "batch_decode_ms_per_frame": 1000 * unpack_s / len(unique),
                     "psnr_db": psnr(seen, frames), "fallback_frames": coder.fallbacks}
    png = out["png"]["bytes_per_transition"]
    for row in out.values():
        row["bytes_vs_png"] = row["bytes_per_transition"] / png
    return out


def cnn_bundle(work: Path) -> tuple[bytes, Path]:
    """A signed bundle of an untrained CarRacing CNN policy (frame stack STACK) and its public key."""
    import gymnasium as gym

    from cloud.learners._cnn import make_agent
    from cloud.learners._ppo_config import PPOConfig
    from cloud.switching._modes import PolicyPublisher
    from device import ObsPipeline, make_env, space_to_json

    env = make_env(ENV, ObsPipeline(frame_stack=STACK))
    obs_space, act_space = env.observation_space, env.action_space
    env.close()
    agent = make_agent(tuple(obs_space.shape), obs_space.dtype, action_dim=3, discrete=False, config=PPOConfig())
    from cloud.learners._agent import ObsNormalizer

    publisher = PolicyPublisher(work, agent=agent, normalizer=ObsNormalizer(obs_space.shape, clip=10, enabled=False),
                                obs_space=space_to_json(obs_space), action_space=space_to_json(act_space),
                                policy="carracing")
    assert isinstance(act_space, gym.spaces.Box)
    return publisher.bundle(0), publisher.public_key


def measure_modes(codecs: list[str], *, fragments: int, steps: int, work: Path) -> dict[str, dict[str, Any]]:
    """Fragments/s and bytes per fragment of the decoupled (fragments) and functions sources, per codec."""
    from cloud.rollout._decoupled import FragmentSource, start_services
    from cloud.rollout._serverless import ServerlessConfig, ServerlessError, make_serverless_source
    from device import ObsPipeline

    bundle, public_key = cnn_bundle(work)
    out: dict[str, dict[str, Any]] = {}
    for spec in codecs:
        pipeline = ObsPipeline(frame_stack=STACK, obs_codec=spec)
        row: dict[str, Any] = {}
        services = start_services(ENV, count=2, envs=1, seed=0, trust=[str(public_key)], pipeline=pipeline)
        source = FragmentSource([s.address for s in services], steps=steps, inflight=1, owned=services,
                                timeout_s=600.0)
        try:
            source.set_policy(bundle)
            next(iter(source.fragments(1)))  # warm: envs reset, onnxruntime session built
            started = time.perf_counter()
            got = sum(1 for _ in source.fragments(fragments))
            row["decoupled_fragments_per_s"] = got / (time.perf_counter() - started)
        finally:
            source.close()
        config = ServerlessConfig(env_id=ENV, envs_per_invocation=1, steps_per_invocation=steps, seed=0,
                                  max_concurrency=2, function_timeout_s=600.0, carry_episodes=False,
                                  frame_stack=STACK, obs_codec=spec)
        fsource = make_serverless_source("local", config)
        try:
            next(iter(fsource.fragments(1)))
            started = time.perf_counter()
            got = sum(1 for _ in fsource.fragments(fragments))
            row["functions_fragments_per_s"] = got / (time.perf_counter() - started)
        except ServerlessError as exc:
            row["functions_fragments_per_s"] = None
            row["functions_refused"] = str(exc)[-160:]
        finally:
            fsource.close()
        out[spec] = row
    return out


def learning_check(codecs: list[str], seeds: list[int], budget: int, work: Path, plot: Path | None, *,
                   quick: bool) -> dict[str, Any]:
    """PPO on CarRacing-v3 (its preset) with each codec and seed for `budget` env steps; final means and curves.

    `quick` shrinks the rollout and the update (one in-process env, 32 steps, one epoch) so the check runs in
    seconds (no episode of CarRacing's 1,000 steps ends in it, so its returns are None).
    """
    from cloud.runs._metrics import read_metrics
    from cloud.runs._presets import find_preset
    from cloud.runs._train import train
    from device import ObsCodec

    preset = find_preset("ppo", ENV)
    assert preset is not None
    small = {"num_envs": 1, "num_steps": 32, "num_minibatches": 1, "update_epochs": 1, "env_mode": "sync"} \
        if quick else {"env_mode": "colocated"}
    curves: dict[str, list[tuple[list[float], list[float]]]] = {}
    finals: dict[str, list[float]] = {}
    for spec in codecs:
        codec = ObsCodec.parse(spec)
        for seed in seeds:
            config = preset.make_config(obs_codec=codec.name, obs_quality=codec.quality or 0, **small)
            run_dir = work / f"learn-{spec.replace(':', '_')}-{seed}"
            result = train(env_id=ENV, total_steps=budget, run_dir=run_dir, seed=seed, config=config,
                           progress=False, log=lambda line: None)
            rows = [r for r in read_metrics(run_dir) if r.get("charts/mean_return_20") is not None]
            xs = [float(r["global_step"]) for r in rows]
            ys = [float(r["charts/mean_return_20"]) for r in rows]
            curves.setdefault(spec, []).append((xs, ys))
            finals.setdefault(spec, []).append(result.mean_return)
            print(f"learning {spec} seed {seed}: 20-episode mean {result.mean_return:.1f} after "
                  f"{result.global_step} steps ({result.wall_s:.0f} s)", flush=True)
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for (spec, runs), colour in zip(curves.items(), ("tab:blue", "tab:orange", "tab:green"), strict=False):
            for i, (xs, ys) in enumerate(runs):
                ax.plot(xs, ys, color=colour, alpha=0.8, label=f"{spec} (seeds {seeds})" if i == 0 else None)
        ax.set_xlabel("env steps")
        ax.set_ylabel("20-episode mean return")
        ax.set_title(f"PPO on {ENV} (preset, frame stack 2): lossless vs lossy observations")
        ax.legend()
        fig.tight_layout()
        fig.savefig(plot, dpi=100)
    return {"budget": budget, "seeds": seeds, "final_mean_return": finals,
            "plot": str(plot) if plot is not None else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer frames and fragments, a tiny learning budget")
    parser.add_argument("--parts", default="codecs,modes,learning", help="comma-separated parts to run")
    parser.add_argument("--budget", type=int, default=None, help="env steps per learning run")
    parser.add_argument("--seeds", default=None, help="seeds of the learning check (default 0,1; --quick: 0)")
    parser.add_argument("--plot", type=Path, default=Path("benchmarks/pixels_learning.png"),
                        help="where the learning curves go")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    report: dict[str, Any] = {"benchmark": "pixels", "env": ENV, "frame_stack": STACK, "quick": args.quick}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "codecs" in parts:
            steps = 12 if args.quick else 128
            codecs = measure_codecs(carracing_frames(steps))
            print(f"{'codec':9} {'B/transition':>12} {'vs PNG':>7} {'enc ms/frame':>12} {'dec ms/frame':>12} "
                  f"{'PSNR dB':>8}")
            for spec, row in codecs.items():
                print(f"{spec:9} {row['bytes_per_transition']:12,.0f} {row['bytes_vs_png']:7.2f} "
                      f"{row['encode_ms_per_frame']:12.2f} {row['decode_ms_per_frame']:12.2f} {row['psnr_db']:8.1f}")
            report["codecs"] = codecs
            report["bytes_vs_png"] = {spec: round(row["bytes_vs_png"], 4) for spec, row in codecs.items()}
        if "modes" in parts:
            modes = measure_modes([LOSSY] if args.quick else ["raw", "png", "webp", LOSSY],
                                  fragments=1 if args.quick else 3, steps=16 if args.quick else 128, work=work)
            print(f"{'codec':9} {'decoupled frag/s':>16} {'functions frag/s':>16}")
            for spec, row in modes.items():
                f = row["functions_fragments_per_s"]
                print(f"{spec:9} {row['decoupled_fragments_per_s']:16.3f} "
                      f"{'refused' if f is None else f'{f:.3f}':>16}")
            report["modes"] = modes
        if "learning" in parts:
            budget = args.budget or (64 if args.quick else 16_384)
            seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1")).split(",")]
            report["learning"] = learning_check(["raw", LOSSY], seeds, budget, work, args.plot, quick=args.quick)
            finals = report["learning"]["final_mean_return"]
            report["learning"]["median_final"] = {k: statistics.median(v) for k, v in finals.items()}
    print(json.dumps(finite(report)))


def finite(value: Any) -> Any:
    """`value` with every non-finite float (a lossless codec's PSNR, a return no episode gave) as None."""
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


if __name__ == "__main__":
    main()
