"""A real agent process killed with SIGKILL in the middle of a swap: last will, clean restart, then the update."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from edge import FleetMonitor, Publisher
from tests._services import Mosquitto
from tests.edge._agents import agent_config, running_agents, wait_until
from tests.edge._policies import cartpole_bundle, make_keys

REPO = Path(__file__).resolve().parents[2]

_AGENT = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from edge import EdgeAgent
    from tests.edge._agents import agent_config

    def on_phase(phase, bundle):
        if phase == "staged" and bundle.version == 2:  # new slot written, pointer not yet swapped: die here
            os.kill(os.getpid(), signal.SIGKILL)

    config = agent_config(Path(sys.argv[1]), "n1", Path(sys.argv[2]), sys.argv[3], fleet="presence", duration=60)
    agent = EdgeAgent(config, on_phase=on_phase).start()
    agent.run()
""")


def test_kill_9_mid_swap_then_restart(tmp_path: Path, mosquitto: Mosquitto) -> None:
    key, pub = make_keys(tmp_path / "keys")
    with Publisher(broker=mosquitto.url, fleet="presence") as publisher, \
            FleetMonitor(broker=mosquitto.url, fleet="presence") as monitor:
        publisher.publish(cartpole_bundle(key, 1))
        proc = subprocess.Popen([sys.executable, "-c", _AGENT.format(repo=str(REPO)), str(tmp_path), str(pub),
                                 mosquitto.url], stderr=subprocess.PIPE, text=True)
        try:
            wait_until(lambda: any(v.online and v.version == 1 for v in monitor.snapshot()), timeout=30,
                       what="agent process online on v1")
            publisher.publish(cartpole_bundle(key, 2))
            assert proc.wait(timeout=30) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            assert proc.stderr is not None
            proc.stderr.close()
        # presence: the broker published the last will (retained): the node is offline
        wait_until(lambda: [v.online for v in monitor.snapshot()] == [False], what="last will")
    # restart with no broker: the cache still points at v1 (the swap never happened) and acts on it
    absent = Mosquitto(tmp_path / "absent")
    with running_agents([agent_config(tmp_path, "n1", pub, absent.url, fleet="presence", steps=50)]) as (agent,):
        assert agent.version == 1
        wait_until(lambda: agent.counters.steps >= 50, what="steps on v1")
    # back on the broker: the retained v2 installs
    with running_agents([agent_config(tmp_path, "n1", pub, mosquitto.url, fleet="presence")]) as (agent,):
        wait_until(lambda: agent.version == 2, what="v2 after restart")


_STREAM = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from edge import EdgeAgent
    from tests.edge._agents import agent_config

    config = agent_config(Path(sys.argv[1]), "n1", Path(sys.argv[2]), sys.argv[3], fleet="stress", duration=60)
    EdgeAgent(config).start().run()
""")


@pytest.mark.slow
def test_kill_9_at_random_moments_during_updates_always_leaves_a_valid_cache(tmp_path: Path,
                                                                            mosquitto: Mosquitto) -> None:
    import random

    from device import TrustStore, load_public_key
    from edge import PolicyCache

    key, pub = make_keys(tmp_path / "keys")
    rng = random.Random(0)
    version = 1
    with Publisher(broker=mosquitto.url, fleet="stress") as publisher:
        publisher.publish(cartpole_bundle(key, version))
        for _ in range(8):
            proc = subprocess.Popen([sys.executable, "-c", _STREAM.format(repo=str(REPO)), str(tmp_path), str(pub),
                                     mosquitto.url], stderr=subprocess.DEVNULL)
            try:
                time.sleep(2.0)  # started and caught up on the retained latest
                for _ in range(3):
                    version += 1
                    publisher.publish(cartpole_bundle(key, version))
                    time.sleep(rng.uniform(0.0, 0.03))
                proc.send_signal(signal.SIGKILL)  # somewhere inside verify / health check / slot write / swap
            finally:
                proc.wait()
            cache = PolicyCache(tmp_path / "n1", trust=TrustStore([load_public_key(pub)]))
            loaded = cache.load()
            assert loaded is not None and 1 <= loaded.version <= version
