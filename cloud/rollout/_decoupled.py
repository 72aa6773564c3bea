"""Decoupled rollout sources: M gRPC env services feeding the learner with the co-located contract.

Two shapes of the same source:

    DecoupledVectorEnv   a `gymnasium.vector.VectorEnv` over batched Step calls (one call per service
                         per step, all services in parallel): drop-in for a learner that steps envs
                         itself (`make_vector_env(..., mode="decoupled")`)
    FragmentSource       yields `device.RolloutBatch` fragments acted by the services themselves with
                         the current policy bundle; no per-step round trip remains

Failure handling. Every call has a deadline. A service whose call fails with UNAVAILABLE or passes
its deadline (`ServiceUnavailableError`: dead or hung) is marked dead; FragmentSource re-issues the
fragment to another live service, DecoupledVectorEnv moves the dead service's env slots to a spare
service (their episodes end as truncated, the next step resets them, exactly gymnasium's NEXT_STEP
autoreset); with no spare left, a service it started itself is restarted (`RESTARTS`, with backoff,
logged). Training goes on as long as capacity remains.

Staleness. Every fragment carries the policy version that acted. `StalenessGate` records the lag
(learner version - acting version) of every fragment and drops fragments whose lag exceeds
`max_lag`, counting them. We drop rather than truncate importance ratios: the PPO learner already
uses the behaviour log-probs the fragment carries as its "old" policy, so its clipped ratio bounds
the update from moderately stale data; data beyond the bound is off-policy by more than the clip
can safely absorb, and dropping keeps the loss the learner's own (no second correction term), while
the drop count makes the cost visible.
"""

from __future__ import annotations

import logging
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cloud._errors import CloudError
from cloud.rollout._envs import VECTOR_ENV_MODES
from device import ObsPipeline, RolloutBatch, require
from functions._envservice import EnvServiceClient, ServiceUnavailableError, space_from_json
from functions._lifetime import child_environment
from functions._secure import PLAINTEXT, ServiceTLS, is_loopback, split_target

log = logging.getLogger(__name__)


RESTARTS = 3
"""Restarts of its own dead env services a `DecoupledVectorEnv` attempts over its life (spares are used first)."""

CLOSE_S = 5.0
"""Seconds `DecoupledVectorEnv.close` waits for each channel to close."""

RESTART_BACKOFF_S = 0.5
"""Wait before the first restart; it doubles with each further one."""


class DecoupledError(CloudError):
    """The decoupled source cannot go on (no live service left, services disagree on spaces)."""


# -- staleness ---------------------------------------------------------------------------------------


@dataclass
class StalenessGate:
    """Records policy lag per fragment and drops fragments staler than `max_lag` versions (counted)."""

    max_lag: int = 2
    """Largest accepted (learner version - acting version); larger fragments are dropped."""
    lags: Counter[int] = field(default_factory=Counter)
    """Transitions seen per lag."""
    dropped_fragments: int = 0
    dropped_transitions: int = 0
    accepted_transitions: int = 0

    def admit(self, batch: RolloutBatch, learner_version: int) -> RolloutBatch | None:
        """Return `batch` when its oldest acting version is within `max_lag` of the learner, else None."""
        lag = learner_version - int(batch.policy_version.min())
        self.lags[lag] += batch.size
        if lag > self.max_lag:
            self.dropped_fragments += 1
            self.dropped_transitions += batch.size
            return None
        self.accepted_transitions += batch.size
        return batch

    def summary(self) -> dict[str, Any]:
        """Counts and the lag distribution, for logs and benchmarks."""
        return {"max_lag": self.max_lag, "accepted_transitions": self.accepted_transitions,
                "dropped_transitions": self.dropped_transitions, "dropped_fragments": self.dropped_fragments,
                "lag_histogram": {str(k): v for k, v in sorted(self.lags.items())}}


# -- services started by strata itself ---------------------------------------------------------------


class ServiceProcess:
    """One `strata envs serve` subprocess on loopback; `address` is read from its start-up line."""

    def __init__(self, env_id: str, *, envs: int, seed: int = 0, param_server: str = "", policy: str = "",
                 trust: Sequence[str] = (), start_timeout_s: float = 60.0, tls: ServiceTLS = PLAINTEXT,
                 pipeline: ObsPipeline | None = None) -> None:
        self._args: dict[str, Any] = {"env_id": env_id, "envs": envs, "seed": seed, "param_server": param_server,
                                      "policy": policy, "trust": tuple(trust), "start_timeout_s": start_timeout_s,
                                      "tls": tls, "pipeline": pipeline}
        cmd = [sys.executable, "-m", "cloud.cli", "envs", "serve", "--env", env_id, "--envs", str(envs),
               "--port", "0", "--seed", str(seed), *tls.flags()]
        if pipeline is not None:
            cmd += ["--frame-stack", str(pipeline.frame_stack), "--obs-codec", pipeline.obs_codec]
        if trust:
            cmd += ["--trust", *trust]
        if param_server:
            cmd += ["--param-server", param_server, "--policy", policy]
        # stderr goes to a file, not a pipe: nobody drains a pipe while the service runs, and a full pipe
        # would block the service on its next warning.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (lives as long as the process; stop closes it)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                     env=child_environment())  # it stops when this process is gone
        assert self.proc.stdout is not None
        line = ""
        deadline = time.monotonic() + start_timeout_s
        while " on " not in line:
            line = self.proc.stdout.readline()
            if not line and (self.proc.poll() is not None or time.monotonic() > deadline):
                self.proc.kill()
                self.proc.wait()
                self._stderr.seek(0)
                err = self._stderr.read()[-2000:]
                self.stop()
                raise DecoupledError(f"ServiceProcess: `strata envs serve --env {env_id}` did not start: {err}")
        self.address = line.rsplit(" on ", 1)[1].strip()

    @property
    def seed(self) -> int:
        """The seed the service was started with."""
        return int(self._args["seed"])

    def restarted(self, *, seed: int) -> ServiceProcess:
        """Stop this process (if it still runs) and start another with the same arguments and seed `seed`."""
        self.stop()
        return ServiceProcess(**{**self._args, "seed": seed})

    def stop(self) -> None:
        """Terminate the process (kill after 5 s)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


def start_services(env_id: str, *, count: int, envs: int, seed: int = 0, param_server: str = "",
                   policy: str = "", trust: Sequence[str] = (), tls: ServiceTLS = PLAINTEXT,
                   pipeline: ObsPipeline | None = None) -> list[ServiceProcess]:
    """Start `count` env-service subprocesses of `envs` envs each (seeds spaced by `envs`).

    `trust` names public-key files the services verify pushed bundles with; `tls` is the option set they serve
    with (their clients need the same run's credentials); `pipeline` is the observation pipeline they make their
    envs with (and whose codec their replies travel in).
    """
    started: list[ServiceProcess] = []
    try:
        for i in range(count):
            started.append(ServiceProcess(env_id, envs=envs, seed=seed + i * envs, param_server=param_server,
                                          policy=policy, trust=trust, tls=tls, pipeline=pipeline))
    except BaseException:
        for p in started:
            p.stop()
        raise
    return started


def parse_services(spec: str | Sequence[str]) -> list[str]:
    """``"HOST:PORT,HOST:PORT"`` (or a list) -> addresses; raise `DecoupledError` on an empty or bad entry."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out = [s.strip() for s in items if s.strip()]
    bad = [s for s in out if ":" not in s or not s.rsplit(":", 1)[1].isdigit()]
    if not out or bad:
        raise DecoupledError(f"env services {spec!r}: expected HOST:PORT[,HOST:PORT...], bad entries {bad}")
    return out


def discover_services(spec: str | Sequence[str], *, resolve: Any = None) -> list[tuple[str, str]]:
    """``(target, server name)`` of every env service `spec` names (`parse_services` form).

    An entry whose host is a DNS name (not ``localhost``) is resolved now, and each of its addresses is one service:
    a Kubernetes headless Service's name lists every ready env-service pod. Their certificates are checked against
    that name (the server name), not the address. IPv4 addresses are used when the name has any.
    """
    import socket

    lookup = resolve or socket.getaddrinfo
    out: list[tuple[str, str]] = []
    for target in parse_services(spec):
        host, port = split_target(target)
        if is_loopback(host) or _is_address(host):
            out.append((target, ""))
            continue
        try:
            infos = lookup(host, int(port), type=socket.SOCK_STREAM)
        except OSError as exc:
            raise DecoupledError(f"env services: cannot resolve {host!r} ({exc}); pass HOST:PORT of running "
                                 "services") from None
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        v4 = [a for a in addresses if ":" not in a]
        for address in v4 or addresses:
            out.append((f"[{address}]:{port}" if ":" in address else f"{address}:{port}", host))
    return out


def _is_address(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


# -- fragments ---------------------------------------------------------------------------------------


@dataclass
class FragmentStats:
    """What a `FragmentSource` did: fragments, re-issues and dead services."""

    fragments: int = 0
    transitions: int = 0
    reissued: int = 0
    dead: list[str] = field(default_factory=list)


class FragmentSource:
    """Rollout fragments from M env services, `inflight` requests per service, failures re-issued."""

    def __init__(self, addresses: Sequence[str], *, steps: int, timeout_s: float = 5.0, inflight: int = 2,
                 codec: str = "", gate: StalenessGate | None = None, refresh_policy: bool = False,
                 owned: Sequence[ServiceProcess] = (), tls: ServiceTLS = PLAINTEXT) -> None:
        if steps < 1 or inflight < 1:
            raise DecoupledError(f"FragmentSource: steps={steps} and inflight={inflight} must be >= 1")
        self.clients = [EnvServiceClient(a, timeout_s=timeout_s, tls=tls, server_name=name)
                        for a, name in discover_services(addresses)]
        self.steps = steps
        self.inflight = inflight
        self.codec = codec
        self.gate = gate or StalenessGate()
        self.refresh_policy = refresh_policy
        self.learner_version = 0
        self.min_version = 0
        self.stats = FragmentStats()
        self._alive = [True] * len(self.clients)
        self._done: queue.Queue[tuple[int, Any]] = queue.Queue()
        self._pending: Counter[int] = Counter()
        self._owned = list(owned)

    def close(self) -> None:
        """Close every channel, and stop the services handed over in `owned` (started for this source)."""
        for c in self.clients:
            c.close()
        for p in self._owned:
            p.stop()
        self._owned.clear()

    def set_policy(self, bundle: bytes) -> int:
        """Push a bundle to every live service; return its version (the learner's current version)."""
        version = 0
        for i, c in enumerate(self.clients):
            if self._alive[i]:
                try:
                    version = c.set_policy(bundle)
                except ServiceUnavailableError:
                    self._mark_dead(i)
        self.learner_version = max(self.learner_version, version)
        return version

    def revive(self, timeout_s: float = 0.5) -> list[str]:
        """Health-check the dead services (a restarted one on the same address); return those back in use."""
        back = []
        for i, ok in enumerate(self._alive):
            c = self.clients[i]
            if not ok and c.health(timeout_s):
                self._alive[i] = True
                self.stats.dead.remove(c.target)
                back.append(c.target)
        return back

    def _mark_dead(self, i: int) -> None:
        if self._alive[i]:
            self._alive[i] = False
            self.stats.dead.append(self.clients[i].target)
            log.warning("FragmentSource: env service %s is dead or hung; its fragments go to the %d live services",
                        self.clients[i].target, sum(self._alive))
        if not any(self._alive):
            raise DecoupledError(f"FragmentSource: every env service is dead or hung ({self.stats.dead}); "
                                 "start more with `strata envs serve` and pass them in")

    def _issue(self, i: int) -> None:
        fut = self.clients[i].rollout_future(self.steps, min_version=self.min_version, codec=self.codec,
                                             refresh_policy=self.refresh_policy)
        self._pending[i] += 1
        fut.add_done_callback(lambda f, i=i: self._done.put((i, f)))

    def _pick(self) -> int:
        live = [i for i, ok in enumerate(self._alive) if ok]
        return min(live, key=lambda i: self._pending[i])

    def fragments(self, count: int | None = None) -> Iterator[RolloutBatch]:
        """Yield admitted fragments (up to `count`, forever when None) as services finish them.

        With a `count`, no more work is issued than those `count` fragments need (a lost or
        dropped fragment is replaced), so nothing is left in flight when the iterator ends: the
        learner can change the policy, or the switcher the source, right after it.
        """
        yielded = 0

        def wanted() -> bool:
            return count is None or yielded + sum(self._pending.values()) < count

        for i, ok in enumerate(self._alive):
            while ok and self._pending[i] < self.inflight and wanted():
                self._issue(i)
        while count is None or yielded < count:
            i, fut = self._done.get()
            self._pending[i] -= 1
            try:
                batch = self.clients[i].rollout_result(fut)
            except ServiceUnavailableError:
                self._mark_dead(i)
                self.stats.reissued += 1
                self._issue(self._pick())
                continue
            self.stats.fragments += 1
            self.stats.transitions += batch.size
            admitted = self.gate.admit(batch, self.learner_version)
            if admitted is not None:
                yielded += 1
            if self._alive[i] and wanted():
                self._issue(i)
            if admitted is not None:
                yield admitted


# -- vector env --------------------------------------------------------------------------------------


_VECTOR_ENV_CLASS: type | None = None


def decoupled_vector_env_class() -> type:
    """The `DecoupledVectorEnv` class, built on first use so importing strata does not import gymnasium."""
    global _VECTOR_ENV_CLASS
    if _VECTOR_ENV_CLASS is None:
        gym = require("gymnasium", extra="cloud", purpose="the decoupled vector env")
        _VECTOR_ENV_CLASS = type("DecoupledVectorEnv", (_DecoupledVectorEnvImpl, gym.vector.VectorEnv), {
            "__doc__": _DecoupledVectorEnvImpl.__doc__, "__module__": __name__})
    return _VECTOR_ENV_CLASS


def make_decoupled_vector_env(env_id: str, *, num_envs: int, seed: int, services: str | Sequence[str] = "",
                              envs_per_service: int = 0, spares: int = 0, timeout_s: float = 5.0,
                              autoreset: str = "same_step", tls: ServiceTLS = PLAINTEXT,
                              pipeline: ObsPipeline | None = None) -> Any:
    """A `DecoupledVectorEnv` over `services` (``HOST:PORT,...``), or over services it starts itself.

    Registered as the `cloud.rollout._envs.make_vector_env` builder of ``mode="decoupled"`` (below). With no
    `services` it starts ``num_envs / envs_per_service + spares`` `strata envs serve` subprocesses
    (``envs_per_service`` 0: two services when `num_envs` is even, else one) and stops them on
    ``close()``. The env is reset with `seed` before it is returned. `tls` secures the connections (and the
    services it starts).
    """
    started: list[ServiceProcess] = []
    if services:
        addresses = parse_services(services)
    else:
        per = envs_per_service or (num_envs // 2 if num_envs % 2 == 0 and num_envs > 1 else num_envs)
        if num_envs % per:
            raise DecoupledError(f"make_decoupled_vector_env: num_envs={num_envs} is not a multiple of "
                                 f"envs_per_service={per}")
        started = start_services(env_id, count=num_envs // per + spares, envs=per, seed=seed, tls=tls,
                                 pipeline=pipeline)
        addresses = [p.address for p in started]
    try:
        env = decoupled_vector_env_class()(addresses, num_envs=num_envs, timeout_s=timeout_s, autoreset=autoreset,
                                           tls=tls)
    except BaseException:
        for p in started:
            p.stop()
        raise
    env._owned = started
    env.reset(seed=seed)
    return env


class _DecoupledVectorEnvImpl:
    """A gymnasium VectorEnv whose envs live in M env services, stepped by one batched call per service.

    The first services whose env counts add up to `num_envs` are active; the others are spares that
    take over the slots of a service that dies or hangs. Autoreset is ``same_step`` (the learner's
    contract, `cloud.rollout._envs`) or gymnasium's default ``next_step``.
    """

    def __init__(self, addresses: Sequence[str], *, num_envs: int | None = None, timeout_s: float = 5.0,
                 autoreset: str = "same_step", tls: ServiceTLS = PLAINTEXT) -> None:
        gym = require("gymnasium", extra="cloud", purpose="the decoupled vector env")
        from gymnasium.vector.utils import batch_space

        clients = [EnvServiceClient(a, timeout_s=timeout_s, tls=tls, server_name=name)
                   for a, name in discover_services(addresses)]
        specs = [c.spec() for c in clients]
        first = specs[0]
        for s, c in zip(specs, clients, strict=True):
            if (s["observation_space"], s["action_space"]) != (first["observation_space"], first["action_space"]):
                raise DecoupledError(f"DecoupledVectorEnv: service {c.target} hosts {s['env_id']} with other spaces "
                                     f"than {clients[0].target} ({first['env_id']}); use one env id everywhere")
        total = 0
        self._active: list[tuple[EnvServiceClient, int, int]] = []  # (client, first slot, K)
        self._spares: list[EnvServiceClient] = []
        for c, s in zip(clients, specs, strict=True):
            if num_envs is None or total < num_envs:
                self._active.append((c, total, s["num_envs"]))
                total += s["num_envs"]
            else:
                self._spares.append(c)
        if num_envs is not None and total != num_envs:
            raise DecoupledError(f"DecoupledVectorEnv: num_envs={num_envs} does not match the services' env counts "
                                 f"({[s['num_envs'] for s in specs]}); pick num_envs as a sum of a prefix of them")
        self.num_envs = total
        self.single_observation_space = space_from_json(first["observation_space"])
        self.single_action_space = space_from_json(first["action_space"])
        self.observation_space = batch_space(self.single_observation_space, total)
        self.action_space = batch_space(self.single_action_space, total)
        mode = {"next_step": gym.vector.AutoresetMode.NEXT_STEP,
                "same_step": gym.vector.AutoresetMode.SAME_STEP}.get(autoreset)
        if mode is None:
            raise DecoupledError(f"DecoupledVectorEnv: autoreset={autoreset!r} is not 'next_step' or 'same_step'")
        self.metadata = {"autoreset_mode": mode}
        self._autoreset = autoreset
        self._obs: np.ndarray = np.zeros((total, *self.single_observation_space.shape),
                                        dtype=self.single_observation_space.dtype)
        self._pending_reset: dict[int, np.ndarray] = {}  # active index -> obs of a spare that took over
        self.failovers: list[str] = []
        self.restarts: list[str] = []
        """Addresses of the dead services this env restarted (its own ones), one entry per attempt."""
        self._owned: list[ServiceProcess] = []
        self._timeout_s, self._tls = timeout_s, tls

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env (slot j seeded with ``seed + j``)."""
        for c, start, k in self._active:
            self._obs[start:start + k] = c.reset(None if seed is None else seed + start)
        self._pending_reset.clear()
        return self._obs.copy(), {}

    def _failover(self, a: int) -> None:
        client, start, k = self._active[a]
        while self._spares:
            spare = self._spares.pop(0)
            try:
                if spare.spec()["num_envs"] != k:
                    continue
                self._pending_reset[a] = spare.reset()
            except ServiceUnavailableError:
                continue
            self._active[a] = (spare, start, k)
            self.failovers.append(f"{client.target}->{spare.target}")
            log.warning("DecoupledVectorEnv: env service %s is dead or hung; its %d envs moved to spare %s (their "
                        "episodes end as truncated)", client.target, k, spare.target)
            return
        if self._restart(a):
            return
        raise DecoupledError(f"DecoupledVectorEnv: env service {client.target} is dead or hung and no spare with "
                             f"{k} envs is left; pass more services than num_envs needs")

    def _restart(self, a: int) -> bool:
        """Start a new service in place of active service `a`, if this env started the dead one itself.

        At most `RESTARTS` restarts over the env's life, each after a backoff that doubles (`RESTART_BACKOFF_S`);
        each is logged and counted in `restarts`. False when the service is someone else's or the budget is spent.
        """
        client, start, k = self._active[a]
        owned = next((i for i, p in enumerate(self._owned) if p.address == client.target), None)
        if owned is None:
            return False
        while len(self.restarts) < RESTARTS:
            attempt = len(self.restarts)
            time.sleep(RESTART_BACKOFF_S * 2 ** attempt)
            self.restarts.append(client.target)
            try:
                process = self._owned[owned].restarted(seed=self._owned[owned].seed + 7919 * (attempt + 1))
            except DecoupledError as exc:
                log.warning("DecoupledVectorEnv: restart %d of %d of env service %s failed: %s", attempt + 1,
                            RESTARTS, client.target, str(exc).splitlines()[0][:200])
                continue
            self._owned[owned] = process
            [(target, name)] = discover_services([process.address])
            fresh = EnvServiceClient(target, timeout_s=self._timeout_s, tls=self._tls, server_name=name)
            try:
                self._pending_reset[a] = fresh.reset()
            except ServiceUnavailableError:
                fresh.close()
                continue
            client.close()
            self._active[a] = (fresh, start, k)
            log.warning("DecoupledVectorEnv: env service %s died; restarted it as %s (restart %d of %d; its %d "
                        "envs' episodes end as truncated)", client.target, process.address, attempt + 1, RESTARTS, k)
            return True
        return False

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env: one batched Step call per service, all in flight at once."""
        actions = np.asarray(actions)
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float64)
        terms = np.zeros(n, dtype=bool)
        truncs = np.zeros(n, dtype=bool)
        final = np.full(n, None, dtype=object) if self._autoreset == "same_step" else None
        calls = []
        for a, (c, start, k) in enumerate(self._active):
            if a in self._pending_reset:
                continue
            calls.append((a, c.step_future(actions[start:start + k], autoreset=self._autoreset)))
        for a, fut in calls:
            c, start, k = self._active[a]
            try:
                out = c.step_result(fut)
            except ServiceUnavailableError:
                self._failover(a)
                truncs[start:start + k] = True  # the episodes end here: their simulator is gone
                if final is not None:
                    for j in range(k):
                        final[start + j] = self._obs[start + j].copy()
                    self._obs[start:start + k] = self._pending_reset.pop(a)
                continue
            self._obs[start:start + k] = out["obs"]
            rewards[start:start + k] = out["rewards"]
            terms[start:start + k] = out["terminations"]
            truncs[start:start + k] = out["truncations"]
            if final is not None:
                for j in np.flatnonzero(out["terminations"] | out["truncations"]).tolist():
                    final[start + j] = out["final_obs"][j]
        for a in [a for a in self._pending_reset if all(a != b for b, _ in calls)]:
            _, start, k = self._active[a]
            self._obs[start:start + k] = self._pending_reset.pop(a)  # NEXT_STEP: this step only resets
        infos: dict[str, Any] = {}
        if final is not None and (terms | truncs).any():
            infos = {"final_obs": final, "_final_obs": terms | truncs}
        return self._obs.copy(), rewards, terms, truncs, infos

    def close_extras(self, **kwargs: Any) -> None:
        """Close the channels, and stop the services this env started itself (others keep running).

        A channel whose call a stop interrupted can wait for ever in grpc's close (seen after a restart): each
        closes in a daemon thread, waited for a few seconds at most.
        """
        closing = [threading.Thread(target=c.close, name="strata-channel-close", daemon=True)
                   for c in [c for c, _, _ in self._active] + self._spares]
        for thread in closing:
            thread.start()
        for thread in closing:
            thread.join(CLOSE_S)
        for p in self._owned:
            p.stop()


# The learner's env factory is a registry (cloud.rollout._envs): this source adds itself, starting its own
# services. To use running ones: VECTOR_ENV_MODES["decoupled"] = functools.partial(
# make_decoupled_vector_env, services="HOST:PORT,...").
VECTOR_ENV_MODES.setdefault("decoupled", make_decoupled_vector_env)
