"""The device-tier MQTT contract: the topics between an edge node and its terminal devices, and their payloads.

Topics (under ``strata/{fleet}/``; the patterns and who uses them are in ``device._mqtt_access``, which the
edge tier and infra's IoT policy build on too):

    device-policy                                 retained: a device-tier bundle for the whole fleet (the cloud
                                                  publishes it; every edge gateway verifies and relays it)
    edges/{edge}/device-policy                    retained: the device bundle this edge relays to its devices
    edges/{edge}/devices/{device}/request         JSON `EscalationRequest`, device -> edge
    edges/{edge}/devices/{device}/reply           JSON `EscalationReply`, edge -> device

Bundles travel at QoS 1 (they must arrive). Requests and replies travel at QoS 0: an escalation has a latency
budget of milliseconds, the device falls back to its own action when no reply comes in time, so a lost
message costs one fallback decision while a PUBACK round trip would cost latency on every one.
Payloads are JSON, never pickled; a bad one raises `DevicePayloadError` naming the topic and the problem.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from device._errors import ConfigError, StrataError
from device._mqtt_access import mqtt_topic
from device._names import IDENTIFIER_FORM, is_identifier, shown

MAX_REQUEST_BYTES = 16 * 1024
"""Requests and replies above this size are refused (a micro policy's observation is a few floats)."""


class DevicePayloadError(StrataError, ValueError):
    """An escalation request or reply is malformed; the receiver drops it."""


def check_device_segment(value: str, what: str) -> str:
    """Return `value` if it can be one topic segment (fleet, edge or device id); raise `ConfigError`."""
    if not is_identifier(value):
        raise ConfigError(f"{what} {shown(value)} cannot be an MQTT topic segment: use {IDENTIFIER_FORM} "
                          "(no '/', '+', '#')")
    return value


@dataclass(frozen=True)
class DeviceTopics:
    """Every device-tier topic of one fleet and edge node; the only place these topic strings are built."""

    fleet: str
    edge: str

    def __post_init__(self) -> None:
        check_device_segment(self.fleet, "fleet")
        check_device_segment(self.edge, "edge node")

    @property
    def fleet_device_policy(self) -> str:
        """Retained fleet-wide device bundle, published by the cloud."""
        return mqtt_topic(self.fleet, "fleet_device_policy")

    @property
    def device_policy(self) -> str:
        """Retained device bundle relayed by this edge node."""
        return mqtt_topic(self.fleet, "device_policy", node=self.edge)

    def request(self, device: str) -> str:
        """Escalation requests of one device."""
        device = check_device_segment(device, "device id")
        return mqtt_topic(self.fleet, "device_request", node=self.edge, device=device)

    def reply(self, device: str) -> str:
        """Escalation replies to one device."""
        device = check_device_segment(device, "device id")
        return mqtt_topic(self.fleet, "device_reply", node=self.edge, device=device)

    @property
    def all_requests(self) -> str:
        """Wildcard subscription of the edge gateway to every device's requests (no retained messages needed)."""
        return mqtt_topic(self.fleet, "device_request", node=self.edge, device="+")

    def device_of_request(self, topic: str) -> str | None:
        """The device id of a request topic of this edge, or None for any other topic."""
        head = mqtt_topic(self.fleet, "device_request", node=self.edge, device="\0").split("\0")[0]
        if not topic.startswith(head) or not topic.endswith("/request"):
            return None
        device = topic[len(head):-len("/request")]
        return device if is_identifier(device) else None


def _decode(topic: str, payload: bytes, kind: str) -> dict[str, Any]:
    if len(payload) > MAX_REQUEST_BYTES:
        raise DevicePayloadError(f"{topic}: {kind} of {len(payload)} bytes exceeds {MAX_REQUEST_BYTES}")
    try:
        obj = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DevicePayloadError(f"{topic}: {kind} is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise DevicePayloadError(f"{topic}: {kind} must be a JSON object, got {type(obj).__name__}")
    return obj


def _req_id(topic: str, obj: dict[str, Any], kind: str) -> str:
    rid = obj.get("id")
    if not isinstance(rid, str) or not 0 < len(rid) <= 64:
        raise DevicePayloadError(f"{topic}: {kind} field 'id' must be a string of 1-64 characters, got {rid!r}")
    return rid


def _floats(topic: str, value: Any, what: str) -> tuple[float, ...]:
    if not isinstance(value, list) or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        raise DevicePayloadError(f"{topic}: {what} must be a list of numbers, got {value!r:.80}")
    out = tuple(float(v) for v in value)
    if not all(math.isfinite(v) for v in out):
        raise DevicePayloadError(f"{topic}: {what} contains a non-finite number")
    return out


@dataclass(frozen=True)
class EscalationRequest:
    """A device asks its edge to decide one observation."""

    id: str
    """Correlation id, unique per device; the reply carries it back."""
    obs: tuple[float, ...]
    """The observation, flattened."""
    budget_ms: float
    """How long the device waits; the edge drops a request that queued longer than this."""

    def encode(self) -> bytes:
        """JSON bytes."""
        # Standard JSON only: NaN or Infinity would be refused by every receiver (ValueError here instead).
        return json.dumps({"id": self.id, "obs": list(self.obs), "budget_ms": self.budget_ms},
                          allow_nan=False).encode()

    @classmethod
    def decode(cls, topic: str, payload: bytes) -> EscalationRequest:
        """Parse and validate; raise `DevicePayloadError`."""
        obj = _decode(topic, payload, "escalation request")
        budget = obj.get("budget_ms")
        if not isinstance(budget, int | float) or isinstance(budget, bool) or not 0 < budget <= 60_000:
            raise DevicePayloadError(f"{topic}: escalation request field 'budget_ms' must be a number in (0, 60000], "
                                     f"got {budget!r}")
        return cls(id=_req_id(topic, obj, "escalation request"), obs=_floats(topic, obj.get("obs"), "field 'obs'"),
                   budget_ms=float(budget))


@dataclass(frozen=True)
class EscalationReply:
    """The edge's answer: an action from its policy, or the reason it has none."""

    id: str
    """The request's correlation id."""
    action: tuple[float, ...] | None
    """The action (one number for Discrete, the vector for Box), or None with `error` set."""
    policy_version: int | None = None
    """Version of the edge policy that decided."""
    error: str | None = None
    """Why there is no action (``"no policy"``, ``"busy"``, ``"bad request: ..."``)."""

    def encode(self) -> bytes:
        """JSON bytes."""
        return json.dumps({"id": self.id, "action": None if self.action is None else list(self.action),
                           "policy_version": self.policy_version, "error": self.error}, allow_nan=False).encode()

    @classmethod
    def decode(cls, topic: str, payload: bytes) -> EscalationReply:
        """Parse and validate; raise `DevicePayloadError`."""
        obj = _decode(topic, payload, "escalation reply")
        rid = _req_id(topic, obj, "escalation reply")
        raw_action, error, version = obj.get("action"), obj.get("error"), obj.get("policy_version")
        action = None if raw_action is None else _floats(topic, raw_action, "field 'action'")
        if error is not None and not isinstance(error, str):
            raise DevicePayloadError(f"{topic}: escalation reply field 'error' must be a string or null")
        if action is None and error is None:
            raise DevicePayloadError(f"{topic}: escalation reply has neither 'action' nor 'error'")
        if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
            raise DevicePayloadError(f"{topic}: escalation reply field 'policy_version' must be an integer or null")
        return cls(id=rid, action=action, policy_version=version, error=error)
