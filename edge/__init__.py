"""strata's edge tier: the edge agent, its MQTT link, policy cache, simulators and telemetry.

Start with `EdgeAgent` (``strata edge run``), `Publisher` / `publish_bundle` (``strata publish``) and
`FleetMonitor` (``strata fleet``). The MQTT topic and payload contract lives in `edge._topics`.
"""

from edge._agent import AgentCounters, EdgeAgent, EdgeAgentConfig
from edge._broker_config import BrokerFiles, mosquitto_hash, write_broker_config
from edge._cache import PolicyCache
from edge._demo import FleetDemoResult, run_fleet_demo
from edge._embedded_broker import EmbeddedBroker
from edge._errors import CacheError, EdgeConfigError, EdgeError, PayloadError, PublishError
from edge._fleet import FleetMonitor, NodeView, format_fleet_table
from edge._gateway import EdgeGateway, GatewayConfig, GatewayCounters
from edge._mqtt import LinkConfig, LinkState, MqttLink, PublishResult, PublishState, parse_broker_url
from edge._outbox import Outbox, OutboxConfig, OutboxStats
from edge._policy import HealthConfig, HealthReport, OnnxPolicy, check_policy
from edge._publish import Publisher, publish_bundle
from edge._topics import (
    Announcement,
    Chunk,
    ChunkAssembler,
    Control,
    Experience,
    FleetTopics,
    NodeStatus,
    Telemetry,
    split_bundle,
)

__all__ = [
    "AgentCounters",
    "Announcement",
    "BrokerFiles",
    "CacheError",
    "Chunk",
    "ChunkAssembler",
    "Control",
    "EdgeAgent",
    "EdgeAgentConfig",
    "EdgeConfigError",
    "EdgeError",
    "EdgeGateway",
    "EmbeddedBroker",
    "Experience",
    "FleetDemoResult",
    "FleetMonitor",
    "FleetTopics",
    "GatewayConfig",
    "GatewayCounters",
    "HealthConfig",
    "HealthReport",
    "LinkConfig",
    "LinkState",
    "MqttLink",
    "NodeStatus",
    "NodeView",
    "OnnxPolicy",
    "Outbox",
    "OutboxConfig",
    "OutboxStats",
    "PayloadError",
    "PolicyCache",
    "PublishError",
    "PublishResult",
    "PublishState",
    "Publisher",
    "Telemetry",
    "check_policy",
    "format_fleet_table",
    "mosquitto_hash",
    "parse_broker_url",
    "publish_bundle",
    "run_fleet_demo",
    "split_bundle",
    "write_broker_config",
]
