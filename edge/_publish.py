"""Publishing policy bundles to a fleet: `Publisher` (for a training run) and `publish_bundle` (one shot).

A publish writes, each retained at QoS 1 and each waited for until its PUBACK: the chunks of a bundle over
100 KB, then ``policies/{policy}/latest`` (the bundle, or the chunk announcement), then the fleet's
``announce``. Chunks go first so that an agent that sees the new latest finds every chunk already retained.

Hooking a training run: build one ``Publisher(broker=..., fleet=..., every=N)`` next to the exporter and call
``publisher.offer(bundle)`` with every bundle it exports; every N-th version (and the first) is published, the
others are skipped and `offer` returns None. Call `close` when training ends.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from device import Bundle
from edge._errors import EdgeConfigError, PublishError
from edge._mqtt import LinkConfig, MqttLink
from edge._topics import Announcement, FleetTopics, split_bundle


class Publisher:
    """A connection that publishes bundles to one fleet (see the module docstring).

    Args:
        broker: Broker URL.
        fleet: Fleet name.
        every: `offer` publishes every `every`-th version (and the first one it sees).
        client_id: MQTT client id (default: unique per process).
        username: Broker username (the cloud identity of `strata broker config`).
        password: Its password.
        ca_file: CA bundle for TLS.
        cert_file: Client certificate for TLS (AWS IoT).
        key_file: Its key.
        ack_timeout_s: How long to wait for the broker's acknowledgements.
    """

    def __init__(self, *, broker: str, fleet: str, every: int = 1, client_id: str | None = None,
                 username: str | None = None, password: str | None = None, ca_file: str | None = None,
                 cert_file: str | None = None, key_file: str | None = None, ack_timeout_s: float = 10.0) -> None:
        if every < 1:
            raise EdgeConfigError(f"Publisher: every={every} must be >= 1 (publish every N-th version)")
        self.topics = FleetTopics(fleet)
        self.every = every
        self.ack_timeout_s = ack_timeout_s
        self._acked: set[int] = set()
        self._refused: dict[int, str] = {}
        self._cond = threading.Condition()
        self._last_offered: int | None = None
        config = LinkConfig(broker=broker, client_id=client_id or f"strata-publisher-{os.getpid()}-{id(self):x}",
                            clean_session=True, username=username, password=password, ca_file=ca_file,
                            cert_file=cert_file, key_file=key_file, protocol="auto")
        self.link = MqttLink(config, on_ack=self._on_ack, on_refused=self._on_refused).start()

    def _on_ack(self, mid: int) -> None:
        with self._cond:
            self._acked.add(mid)
            self._cond.notify_all()

    def _on_refused(self, mid: int, reason: str) -> None:
        with self._cond:
            self._refused[mid] = reason
            self._cond.notify_all()

    def _wait_acked(self, what: str, sent: dict[int, str]) -> None:
        """Block until every mid in `sent` (mid -> topic) is acknowledged; raise `PublishError` on a refusal."""
        deadline = time.monotonic() + self.ack_timeout_s
        with self._cond:
            try:
                while not set(sent) <= self._acked:
                    refused = [(mid, self._refused[mid]) for mid in sent if mid in self._refused]
                    if refused:
                        mid, reason = refused[0]
                        raise PublishError(f"the broker refused {what} on {sent[mid]}: {reason}; publish with the "
                                           "cloud identity of `strata broker config` (--username cloud)")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise PublishError(f"the broker acknowledged {len(set(sent) & self._acked)} of {len(sent)} "
                                           f"messages of {what} within {self.ack_timeout_s}s")
                    self._cond.wait(left)
            finally:
                self._acked -= set(sent)
                for mid in sent:
                    self._refused.pop(mid, None)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Disconnect."""
        self.link.close()

    def offer(self, bundle: Bundle) -> Announcement | None:
        """Publish `bundle` if its version is due (the first offered, then every `every`-th); else None."""
        v = bundle.version
        due = self._last_offered is None or v % self.every == 0
        if not due:
            return None
        self._last_offered = v
        return self.publish(bundle)

    def publish(self, bundle: Bundle | bytes) -> Announcement:
        """Publish one bundle retained to its policy's latest topic; block until the broker acknowledged it."""
        parsed = Bundle.from_bytes(bundle) if isinstance(bundle, bytes) else bundle
        data = bundle if isinstance(bundle, bytes) else bundle.to_bytes()
        ann, chunks = split_bundle(data, policy=parsed.policy, version=parsed.version, published_at=time.time())
        if not self.link.wait_connected(self.ack_timeout_s):
            raise PublishError(f"Publisher.publish: not connected to {self.link.config.broker} after "
                               f"{self.ack_timeout_s}s (state {self.link.state.value}: {self.link.last_error}); "
                               "check the broker URL and credentials")
        sent = {self._send(self.topics.policy_chunk(parsed.policy, c.index), c.encode()):
                self.topics.policy_chunk(parsed.policy, c.index) for c in chunks}
        latest = ann.encode() if chunks else data
        sent[self._send(self.topics.policy_latest(parsed.policy), latest)] = self.topics.policy_latest(parsed.policy)
        sent[self._send(self.topics.announce, ann.encode())] = self.topics.announce
        self._wait_acked(f"Publisher.publish of {parsed.policy} v{parsed.version}", sent)
        return ann

    def publish_device_bundle(self, bundle: Bundle | bytes) -> None:
        """Publish a device-tier bundle retained to the fleet's device topic; edge gateways relay it to devices."""
        from device import DeviceTopics

        data = bundle if isinstance(bundle, bytes) else bundle.to_bytes()
        if not self.link.wait_connected(self.ack_timeout_s):
            raise PublishError(f"Publisher.publish_device_bundle: not connected to {self.link.config.broker} after "
                               f"{self.ack_timeout_s}s (state {self.link.state.value}: {self.link.last_error})")
        topic = DeviceTopics(self.topics.fleet, "fleet").fleet_device_policy
        self._wait_acked("Publisher.publish_device_bundle", {self._send(topic, data): topic})

    def _send(self, topic: str, payload: bytes) -> int:
        result = self.link.publish(topic, payload, retain=True)
        if not result.accepted:
            raise PublishError(f"Publisher.publish: the link queue is full while publishing to {topic}")
        return result.mid


def publish_bundle(bundle: Bundle | bytes | Path, *, broker: str, fleet: str, username: str | None = None,
                   password: str | None = None, ca_file: str | None = None, cert_file: str | None = None,
                   key_file: str | None = None, ack_timeout_s: float = 10.0) -> Announcement:
    """Publish one bundle (object, bytes or file) to `fleet` and wait for the broker's acknowledgements."""
    data = Path(bundle).read_bytes() if isinstance(bundle, Path) else bundle
    with Publisher(broker=broker, fleet=fleet, username=username, password=password, ca_file=ca_file,
                   cert_file=cert_file, key_file=key_file, ack_timeout_s=ack_timeout_s) as publisher:
        return publisher.publish(data)
