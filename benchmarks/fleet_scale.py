"""Fleet scale: 1,000 lightweight agents on one Mosquitto: fan-out, broker restarts, telemetry, `strata fleet`.

Each simulated agent is one real MQTT connection speaking strata's contract (`edge._topics`): it subscribes to
the fleet's announcement and its policy's retained latest topic, verifies each bundle with `device.Verifier`
(Ed25519 + sha256), switches to a newer version and publishes its retained `NodeStatus`, and sends a `Telemetry`
record every ``--telemetry-interval`` seconds at QoS 1 with a persistent session (paho keeps unacknowledged
records and sends them again after a reconnect). Many agents share one process: one thread drives all of that
process's paho clients with ``poll`` (paho's external-loop API), so 1,000 connections need 4 processes, not
1,000 threads. No simulator or onnxruntime runs: this measures the fleet plumbing, not inference.

Phases, all against one Mosquitto (persistence on, loopback):

1. connect all agents (they find the retained v1 and report it);
2. fan-out: `edge.Publisher` publishes v2; time until every agent verified and switched, and until
   `edge.FleetMonitor` saw every retained status on v2;
3. broker restart (SIGTERM, start again on the same port) with reconnect jitter off: the baseline, a
   thundering herd (every agent retries at 0.25, 0.75, 1.75 s ... after the drop);
4. the same restart with the agents' default jittered backoff (`LinkConfig.reconnect_jitter` 0.5);
5. stop telemetry, wait for every PUBACK, count records lost and duplicated at the monitor (goal 0/0);
6. `strata fleet` in a subprocess: wall time and rows for the whole fleet.

Reported per restart: time until all agents are back, the connection attempts (and the peak per 100 ms: the
herd), the peak CONNACKs per 100 ms, and the broker's CPU seconds from its start until all are back.
Prints a table and ends with one JSON line. ``--quick``: 100 agents (< 1 min).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FLEET = "scale"
POLICY = "cartpole"
RECONNECT_MIN_S = 0.25  # the same schedule as edge._mqtt.LinkConfig
RECONNECT_MAX_S = 10.0


# ------------------------------------------------------------------------------------------------- broker

class Broker:
    """Mosquitto on a fixed loopback port that can be restarted (persistence on, so sessions survive)."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        import getpass

        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text("\n".join([
            f"listener {self.port} 127.0.0.1", "allow_anonymous true", "set_tcp_nodelay true",
            f"user {getpass.getuser()}", "persistence true", f"persistence_location {workdir}/",
            "max_queued_messages 1000000", "max_inflight_messages 100", ""]))
        self.binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> float:
        """Start and wait until it listens; return the time it listened."""
        self.proc = subprocess.Popen([self.binary, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return time.time()
            except OSError:
                time.sleep(0.005)
        raise RuntimeError("mosquitto did not start")

    def stop(self) -> None:
        """SIGTERM (Mosquitto saves its persistent state) and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
        self.proc = None

    def cpu_s(self) -> float:
        """User + system CPU seconds of the running broker process."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------------- child

class SimAgent:
    """One lightweight agent: a paho client driven by the swarm's poll loop (see the module docstring)."""

    def __init__(self, swarm: Swarm, node: str) -> None:
        import paho.mqtt.client as mqtt

        from edge import FleetTopics, NodeStatus

        self.swarm, self.node = swarm, node
        self.topics = FleetTopics(FLEET)
        self.status_topic = self.topics.node(node, "status")
        self.telemetry_topic = self.topics.node(node, "telemetry")
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=node, clean_session=False,
                        protocol=mqtt.MQTTv311)
        c.max_inflight_messages_set(100)
        c.will_set(self.status_topic, NodeStatus(node=node, online=False).encode(), qos=1, retain=True)
        c.on_connect, c.on_disconnect = self.on_connect, self.on_disconnect
        c.on_message, c.on_publish = self.on_message, self.on_publish
        c.on_socket_open = lambda client, userdata, sock: sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.client = c
        self.started = False
        self.version: int | None = None
        self.version_at: dict[int, float] = {}
        self.connect_times: list[float] = []
        self.attempt_times: list[float] = []
        self.delay = RECONNECT_MIN_S
        self.next_attempt = 0.0
        self.seq = 0
        self.pending: set[int] = set()
        self.next_telemetry = time.monotonic() + random.random() * swarm.interval

    def attempt(self, host: str, port: int) -> None:
        """One connection attempt (TCP connect + CONNECT); a refusal schedules the next."""
        self.attempt_times.append(time.time())
        try:
            if self.started:
                self.client.reconnect()
            else:
                self.client.connect(host, port, keepalive=30)
                self.started = True
        except OSError:
            self.schedule()

    def schedule(self) -> None:
        """Next attempt after the backoff of `edge._mqtt`: the delay doubles, each sleep jittered downwards."""
        sleep = self.delay * (1.0 - self.swarm.jitter * random.random())
        self.next_attempt = time.monotonic() + sleep
        self.delay = min(self.delay * 2, RECONNECT_MAX_S)

    def on_connect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        """CONNACK: reset the backoff, (re)subscribe, publish the status."""
        if reason_code.is_failure:
            return
        self.delay = RECONNECT_MIN_S
        self.connect_times.append(time.time())
        client.subscribe([(self.topics.announce, 1), (self.topics.policy_latest(POLICY), 1)])
        self.send_status()

    def on_disconnect(self, client: Any, userdata: Any, flags: Any, reason_code: Any, properties: Any) -> None:
        """Connection lost: schedule the reconnect."""
        self.schedule()

    def on_message(self, client: Any, userdata: Any, message: Any) -> None:
        """A retained latest bundle: verify it and switch to a newer version."""
        from device import BundleError

        if message.topic != self.topics.policy_latest(POLICY) or not message.payload:
            return
        try:
            bundle = self.swarm.verifier.verify(bytes(message.payload))
        except BundleError:
            return
        if bundle.version > (self.version or 0):
            self.version = bundle.version
            self.version_at[bundle.version] = time.time()
            self.send_status()

    def on_publish(self, client: Any, userdata: Any, mid: int, reason_code: Any, properties: Any) -> None:
        """PUBACK: the record is delivered."""
        self.pending.discard(mid)

    def send_status(self) -> None:
        """Publish the retained status (version, steps)."""
        from edge import NodeStatus

        status = NodeStatus(node=self.node, online=True, policy=POLICY if self.version else None,
                            version=self.version, updated_at=time.time(), steps=self.seq)
        self.client.publish(self.status_topic, status.encode(), qos=1, retain=True)

    def send_telemetry(self) -> None:
        """Publish the next telemetry record at QoS 1."""
        from edge import Telemetry

        self.seq += 1
        record = Telemetry(record_id=self.seq, node=self.node, sent_at=time.time(), policy=POLICY,
                           version=self.version, policy_age_s=None, steps=100, episodes=1, episode_returns=(100.0,),
                           episode_lengths=(100,), latency_p50_us=5.0, latency_p99_us=9.0,
                           decisions_by_version={str(self.version): 100})
        info = self.client.publish(self.telemetry_topic, record.encode(), qos=1)  # held by paho while offline
        self.pending.add(info.mid)


class Swarm:
    """All agents of one process, driven by one thread with poll()."""

    def __init__(self, nodes: list[str], broker: str, pub: str, interval: float) -> None:
        from device import TrustStore, Verifier, load_public_key

        host, port = broker.removeprefix("mqtt://").split(":")
        self.host, self.port = host, int(port)
        self.verifier = Verifier(trust=TrustStore([load_public_key(pub)]), tier="edge")  # integrity; no state
        self.interval = interval
        self.jitter = 0.5
        self.produce = True
        self.stop = False
        self.agents = [SimAgent(self, n) for n in nodes]

    def run(self) -> None:
        """Drive every client until `stop`: poll, read, write, keepalive, reconnect, produce telemetry."""
        for agent in self.agents:  # stagger the first connects a little, as a fleet booting would
            agent.next_attempt = time.monotonic() + random.random() * 0.5
        last_misc = 0.0
        while not self.stop:
            by_fd: dict[int, SimAgent] = {}
            poller = select.poll()
            for agent in self.agents:
                sock = agent.client.socket()
                if sock is not None:
                    fd = sock.fileno()
                    by_fd[fd] = agent
                    poller.register(fd, select.POLLIN | (select.POLLOUT if agent.client.want_write() else 0))
            for fd, event in poller.poll(20):
                agent = by_fd[fd]
                if event & (select.POLLIN | select.POLLERR | select.POLLHUP):
                    agent.client.loop_read()
                if event & select.POLLOUT and agent.client.socket() is not None:
                    agent.client.loop_write()
            now = time.monotonic()
            if now - last_misc > 0.25:
                last_misc = now
                for agent in self.agents:
                    if agent.client.socket() is not None:
                        agent.client.loop_misc()
            for agent in self.agents:
                if agent.client.socket() is None and agent.next_attempt <= now:
                    agent.attempt(self.host, self.port)
                if self.produce and agent.next_telemetry <= now and agent.started:
                    agent.next_telemetry += self.interval
                    agent.send_telemetry()


def child(args: argparse.Namespace) -> None:
    """Run a swarm; answer the parent's commands on stdin with JSON lines on stdout."""
    swarm = Swarm(args.nodes.split(","), args.broker, args.pub, args.telemetry_interval)
    loop = threading.Thread(target=swarm.run, daemon=True)
    loop.start()

    def wait(predicate: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    for line in sys.stdin:
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "connected":  # every agent connected at least N times
            n = int(arg)
            ok = wait(lambda n=n: all(len(a.connect_times) >= n for a in swarm.agents), 180)
            print(json.dumps({"ok": ok, "times": [a.connect_times[n - 1] if len(a.connect_times) >= n else None
                                                  for a in swarm.agents],
                              "attempts": [t for a in swarm.agents for t in a.attempt_times[-64:]]}), flush=True)
        elif cmd == "version":
            v = int(arg)
            ok = wait(lambda v=v: all(a.version == v for a in swarm.agents), 180)
            print(json.dumps({"ok": ok, "times": [a.version_at.get(v) for a in swarm.agents]}), flush=True)
        elif cmd == "jitter":
            swarm.jitter = float(arg)
            print(json.dumps({"ok": True}), flush=True)
        elif cmd == "flush":
            swarm.produce = False
            ok = wait(lambda: all(not a.pending and a.client.socket() is not None for a in swarm.agents), 180)
            print(json.dumps({"ok": ok, "produced": {a.node: a.seq for a in swarm.agents},
                              "cpu_s": time.process_time()}), flush=True)
        elif cmd == "quit":
            break
    swarm.stop = True
    loop.join(timeout=10)


# ------------------------------------------------------------------------------------------------- parent

class Children:
    """The agent processes, driven by one-line commands."""

    def __init__(self, procs: list[subprocess.Popen[str]]) -> None:
        self.procs = procs

    def ask(self, command: str) -> list[dict[str, Any]]:
        """Send `command` to every child; return their JSON answers."""
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(command + "\n")
            p.stdin.flush()
        answers = []
        for p in self.procs:
            assert p.stdout is not None
            answers.append(json.loads(p.stdout.readline()))
        return answers


def _peak_per_100ms(times: list[float]) -> int:
    buckets: dict[int, int] = {}
    for t in times:
        buckets[int(t * 10)] = buckets.get(int(t * 10), 0) + 1
    return max(buckets.values(), default=0)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def restart(broker: Broker, kids: Children, *, jitter: float, round_no: int, count: int) -> dict[str, Any]:
    kids.ask(f"jitter {jitter}")
    broker.stop()
    down = time.time()
    up = broker.start()
    cpu0 = broker.cpu_s()
    answers = kids.ask(f"connected {round_no}")
    back = [t for a in answers for t in a["times"] if t is not None]
    attempts = [t for a in answers for t in a["attempts"] if t >= down]
    cpu = broker.cpu_s() - cpu0
    return {"jitter": jitter, "all_back": all(a["ok"] for a in answers) and len(back) == count,
            "down_s": round(up - down, 3), "all_back_s": round(max(back) - up, 3),
            "p50_back_s": round(_pct([t - up for t in back], 0.5), 3), "attempts": len(attempts),
            "peak_attempts_per_100ms": _peak_per_100ms(attempts),
            "peak_connacks_per_100ms": _peak_per_100ms(back), "broker_cpu_s": round(cpu, 3)}


def _raise_fd_limit(needed: int) -> None:
    """Raise the soft open-files limit to `needed` (within the hard limit), or stop with the fix."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SystemExit(f"fleet_scale: {needed} open files needed, the hard limit is {hard}; raise it "
                         f"(ulimit -Hn {needed}) or run fewer --agents")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 agents in 2 processes (< 1 minute)")
    parser.add_argument("--agents", type=int, default=None, help="simulated agents (default 1000; 100 with --quick)")
    parser.add_argument("--processes", type=int, default=None, help="processes the agents share (default 4; 2)")
    parser.add_argument("--telemetry-interval", type=float, default=2.0, help="seconds between records per agent")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--broker", help=argparse.SUPPRESS)
    parser.add_argument("--pub", help=argparse.SUPPRESS)
    parser.add_argument("--nodes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    count = args.agents or (100 if args.quick else 1000)
    nproc = args.processes or (2 if args.quick else 4)
    _raise_fd_limit(count + 256)  # the broker holds one socket per agent; children and broker inherit the limit
    sys.path.insert(0, str(REPO))
    from edge_propagation import cartpole_onnx, make_bundle

    from device import generate_keypair, load_signing_key
    from edge import FleetMonitor, Publisher, format_fleet_table

    work = Path(tempfile.mkdtemp(prefix="strata-fleet-scale-"))
    broker = Broker(work)
    broker.start()
    key_path, pub = generate_keypair(work / "keys", name="fleet")
    key = load_signing_key(key_path)
    model = cartpole_onnx()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    nodes = [f"sim{i:05d}" for i in range(count)]
    procs: list[subprocess.Popen[str]] = []
    monitor = FleetMonitor(broker=broker.url, fleet=FLEET, client_id="bench-monitor", persistent=True).start()
    try:
        assert monitor.link.wait_connected(30)
        with Publisher(broker=broker.url, fleet=FLEET) as publisher:
            publisher.publish(make_bundle(key, 1, model))
        t_spawn = time.time()
        for i in range(nproc):
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--child", "--broker", broker.url, "--pub", str(pub),
                 "--telemetry-interval", str(args.telemetry_interval), "--nodes", ",".join(nodes[i::nproc])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO / "benchmarks"))
        kids = Children(procs)
        connected = kids.ask("connected 1")
        first = [t for a in connected for t in a["times"] if t is not None]
        on_v1 = kids.ask("version 1")
        assert all(a["ok"] for a in connected + on_v1), "not every agent connected and found v1"
        connect_all_s = max(first) - t_spawn

        # fan-out of v2
        cpu0 = broker.cpu_s()
        t0 = time.time()
        with Publisher(broker=broker.url, fleet=FLEET) as publisher:
            publisher.publish(make_bundle(key, 2, model))
        answers = kids.ask("version 2")
        switched = [t - t0 for a in answers for t in a["times"] if t is not None]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            views = monitor.snapshot()
            if sum(1 for v in views if v.version == 2) >= count:
                break
            time.sleep(0.01)
        monitor_all_s = time.time() - t0
        fanout_cpu = broker.cpu_s() - cpu0

        baseline = restart(broker, kids, jitter=0.0, round_no=2, count=count)
        jittered = restart(broker, kids, jitter=0.5, round_no=3, count=count)

        flushed = kids.ask("flush")
        produced = {n: c for a in flushed for n, c in a["produced"].items()}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with monitor._lock:
                received = {n: len(monitor.telemetry.get(n, {})) for n in produced}
            if all(received[n] >= produced[n] for n in produced):
                break
            time.sleep(0.05)
        with monitor._lock:
            got = {n: set(monitor.telemetry.get(n, {})) for n in produced}
            duplicated = sum(monitor.duplicates.get(n, 0) for n in produced)
        lost = sum(len(set(range(1, produced[n] + 1)) - got[n]) for n in produced)
        records = sum(produced.values())

        t_render = time.perf_counter()
        table = format_fleet_table(monitor.snapshot())
        render_ms = (time.perf_counter() - t_render) * 1000
        t_cli = time.perf_counter()
        cli = subprocess.run([sys.executable, "-m", "cloud.cli", "fleet", "--broker", broker.url, "--fleet", FLEET,
                              "--wait", "2"], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
        cli_s = time.perf_counter() - t_cli
        cli_rows = len(cli.stdout.splitlines()) - 1
    finally:
        for p in procs:
            if p.stdin is not None and p.poll() is None:
                try:
                    p.stdin.write("quit\n")
                    p.stdin.flush()
                except BrokenPipeError:
                    pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        monitor.close()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)

    rows = [
        ("agents / processes", f"{count} / {nproc}"),
        ("connect all (from spawn)", f"{connect_all_s:.2f} s"),
        ("fan-out v2: every agent switched", f"{max(switched):.3f} s (p50 {_pct(switched, 0.5):.3f} s)"),
        ("fan-out v2: monitor saw all statuses", f"{monitor_all_s:.3f} s; broker CPU {fanout_cpu:.2f} s"),
    ]
    for name, r in (("restart, no jitter (baseline)", baseline), ("restart, jittered backoff", jittered)):
        rows.append((name, f"all back {r['all_back_s']:.3f} s after the broker listened (p50 {r['p50_back_s']:.3f}); "
                           f"{r['attempts']} attempts, peak {r['peak_attempts_per_100ms']} attempts and "
                           f"{r['peak_connacks_per_100ms']} CONNACKs per 100 ms; broker CPU {r['broker_cpu_s']:.2f} s"))
    rows += [("telemetry records", f"{records}: lost {lost}, duplicated {duplicated}"),
             ("fleet table (format_fleet_table)", f"{render_ms:.1f} ms for {len(table.splitlines()) - 1} rows"),
             ("`strata fleet --wait 2`", f"{cli_s:.2f} s wall, {cli_rows} rows, exit {cli.returncode}")]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name.ljust(width)}  {value}")
    print(json.dumps({"benchmark": "fleet_scale", "agents": count, "processes": nproc,
                      "connect_all_s": round(connect_all_s, 3), "fanout_all_s": round(max(switched), 3),
                      "fanout_p50_s": round(_pct(switched, 0.5), 3), "fanout_monitor_all_s": round(monitor_all_s, 3),
                      "fanout_broker_cpu_s": round(fanout_cpu, 3), "restart_baseline": baseline,
                      "restart_jittered": jittered, "telemetry_records": records, "telemetry_lost": lost,
                      "telemetry_duplicated": duplicated, "fleet_render_ms": round(render_ms, 1),
                      "fleet_cli_s": round(cli_s, 2), "fleet_cli_rows": cli_rows, "fleet_cli_rc": cli.returncode}))


if __name__ == "__main__":
    main()
