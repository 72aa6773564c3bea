"""Kubernetes manifests for a strata run: pure models rendered to YAML by `strata infra k8s render --out DIR`.

What is rendered (one object per purpose; names, labels, ports and Secret names come from one place, `Names`)::

    base/                       the run (kustomize base; `kubectl apply -k DIR/base`)
      namespace.yaml            the namespace, Pod Security "restricted"
      serviceaccounts.yaml      one per component, no API token mounted
      learner.yaml              Deployment: one learner (a hybrid group of one unit, so rank 0 serves the parameter
                                server) whose co-located env workers live in its pod (/dev/shm in memory); it
                                steps the env services in decoupled mode; Service for the parameter server
      envs.yaml                 Deployment of env services + HorizontalPodAutoscaler + headless Service the
                                learner discovers (one env service per pod address)
      units.yaml                hybrid units: a StatefulSet running the documented torchrun line + its headless
                                Service (pod 0 hosts the rendezvous) + the shared run volume
      broker.yaml               (--broker) Mosquitto with a TLS listener, its config and Service
      networkpolicies.yaml      default deny; only the learner reaches env services; env services reach the
                                parameter server; units reach each other
    overlays/pytorchjob/        the units as a Kubeflow PyTorchJob instead of the StatefulSet
    overlays/cert-manager/      an Issuer and Certificates that fill the TLS Secrets (instead of `strata certs`)

The seed's placement rule is encoded here: env services prefer the learner's zone (``podAffinity`` on
``topology.kubernetes.io/zone``; chatty services across zones lose their throughput to latency), hybrid units
never share a node (``podAntiAffinity`` on ``kubernetes.io/hostname``) and prefer one zone, and the co-located
workers share their learner's pod. Every pod runs as a non-root user with a read-only root filesystem, no
privilege escalation, all capabilities dropped, the runtime's seccomp profile, requests and limits, and probes.

TLS material comes from Secrets in the ``kubernetes.io/tls`` layout (``tls.crt``, ``tls.key``, ``ca.crt``) that
`strata certs` writes per role and cert-manager fills; the run token from a generic Secret (key ``token``).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device import ConfigError, identifier, shown

Obj = dict[str, Any]

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti)?")
IMAGE = re.compile(r"[a-z0-9][a-z0-9._/:@-]{0,254}")


@dataclass(frozen=True, kw_only=True)
class K8sConfig:
    """What `strata infra k8s render` writes: the run, its images, sizes and placement."""

    # --- the run ---
    namespace: str = "strata"
    """Namespace of every object."""
    run: str = "strata"
    """Run name: the prefix of every object's name and the app.kubernetes.io/instance label."""
    env: str = "CartPole-v1"
    """gymnasium env id the learner trains on and the env services host."""
    total_steps: int = 1_000_000
    """Env-step budget of the learner and of the hybrid units' run."""
    # --- images (built from docker/*.Dockerfile) ---
    cloud_image: str = "strata-cloud:0.1.0"
    """Image of the learner and the hybrid units (docker/cloud.Dockerfile)."""
    env_image: str = "strata-env:0.1.0"
    """Image of the env services (docker/env.Dockerfile)."""
    broker_image: str = "eclipse-mosquitto:2.0.20"
    """Image of the optional Mosquitto broker."""
    # --- env services ---
    env_replicas: int = 2
    """Env-service pods at start (and the autoscaler's minimum); the learner steps this many x envs_per_service."""
    env_max_replicas: int = 8
    """Most env-service pods the autoscaler may run."""
    envs_per_service: int = 8
    """Simulators in each env-service pod."""
    env_cpu_target: int = 70
    """Average CPU utilisation (percent of requests) the autoscaler keeps the env services at."""
    # --- learner ---
    learner_workers: int = 4
    """Co-located env worker processes in the learner's pod (one CPU each, plus one for the learner)."""
    # --- hybrid units ---
    units: int = 2
    """Hybrid units (one pod each, on distinct nodes)."""
    workers_per_unit: int = 4
    """Co-located env workers in each unit's pod."""
    run_storage_class: str = ""
    """StorageClass of the units' shared run volume (ReadWriteMany, e.g. an NFS class); empty: the default."""
    # --- broker ---
    broker: bool = False
    """Also render a Mosquitto broker (TLS listener on 8883) for edge nodes."""

    def __post_init__(self) -> None:
        for name in ("namespace", "run"):
            value = getattr(self, name)
            if not DNS_LABEL.fullmatch(value) or len(value) > 40:
                raise ConfigError(f"strata infra k8s render: --{name} {shown(value)} must be a DNS label of at most "
                                  "40 characters: lowercase letters, digits and '-'")
        identifier(self.env.replace(":", "-"), what="strata infra k8s render: --env")
        for name in ("cloud_image", "env_image", "broker_image"):
            value = getattr(self, name)
            if not IMAGE.fullmatch(value) or value.endswith(":latest") or ":" not in value.rsplit("/", 1)[-1]:
                raise ConfigError(f"strata infra k8s render: --{name.replace('_', '-')} {shown(value)} must be an "
                                  "image reference with a fixed tag or digest (not :latest), e.g. strata-env:0.1.0")
        if self.run_storage_class and not DNS_LABEL.fullmatch(self.run_storage_class):
            raise ConfigError(f"strata infra k8s render: --run-storage-class {shown(self.run_storage_class)} is not "
                              "a StorageClass name")
        for name, low, high in (("total_steps", 1, 10**12), ("env_replicas", 1, 1000), ("env_max_replicas", 1, 1000),
                                ("envs_per_service", 1, 4096), ("env_cpu_target", 1, 100), ("learner_workers", 0, 256),
                                ("units", 1, 1000), ("workers_per_unit", 0, 256)):
            value = getattr(self, name)
            if not low <= value <= high:
                raise ConfigError(f"strata infra k8s render: --{name.replace('_', '-')} {value} must be between "
                                  f"{low} and {high}")
        if self.env_max_replicas < self.env_replicas:
            raise ConfigError(f"strata infra k8s render: --env-max-replicas {self.env_max_replicas} is below "
                              f"--env-replicas {self.env_replicas}")


@dataclass(frozen=True)
class Names:
    """Every name, label, port and mount the objects share, derived from the config in one place."""

    config: K8sConfig
    env_port: int = 50051
    env_health_port: int = 50052
    param_port: int = 50061
    param_health_port: int = 50062
    rdzv_port: int = 29400
    broker_port: int = 8883
    uid: int = 10001
    tls_dir: str = "/etc/strata/tls"
    token_dir: str = "/etc/strata/token"
    run_dir: str = "/var/lib/strata/run"
    components: tuple[str, ...] = field(default=("learner", "env-service", "unit", "broker"))

    def name(self, component: str) -> str:
        """Object name of `component` (``strata-learner``)."""
        short = {"env-service": "envs", "unit": "units"}.get(component, component)
        return f"{self.config.run}-{short}"

    def labels(self, component: str) -> dict[str, str]:
        """The labels that select `component`'s pods."""
        return {"app.kubernetes.io/name": "strata", "app.kubernetes.io/instance": self.config.run,
                "app.kubernetes.io/component": component}

    def tls_secret(self, role: str) -> str:
        """Secret of `role`'s certificate (``kubernetes.io/tls`` layout plus ``ca.crt``)."""
        return f"{self.config.run}-{role}-tls"

    @property
    def token_secret(self) -> str:
        """Generic Secret holding the run token under the key ``token``."""
        return f"{self.config.run}-run-token"

    def fqdn(self, service: str) -> str:
        """Cluster DNS name of a Service."""
        return f"{service}.{self.config.namespace}.svc.cluster.local"

    @property
    def envs_address(self) -> str:
        """What the learner passes as --env-services: the headless Service's name, one service per pod address."""
        return f"{self.fqdn(self.name('env-service'))}:{self.env_port}"

    @property
    def rdzv_endpoint(self) -> str:
        """Unit pod 0's stable name, where torchrun's c10d rendezvous runs."""
        units = self.name("unit")
        return f"{units}-0.{self.fqdn(units)}:{self.rdzv_port}"

    def hosts(self) -> dict[str, list[str]]:
        """Role -> the DNS names its certificate must carry (the `strata certs --role` hosts)."""
        units = self.name("unit")
        learner_hosts = [self.fqdn(self.name("learner")), self.fqdn(units),
                         *(f"{units}-{i}.{self.fqdn(units)}" for i in range(self.config.units))]
        hosts = {"learner": learner_hosts, "env": [self.fqdn(self.name("env-service"))]}
        if self.config.broker:
            hosts["broker"] = [self.fqdn(self.name("broker"))]
        return hosts


# -- building blocks ---------------------------------------------------------------------------------------------------


def _meta(n: Names, name: str, component: str | None = None) -> Obj:
    meta: Obj = {"name": name, "namespace": n.config.namespace}
    meta["labels"] = n.labels(component) if component else {"app.kubernetes.io/name": "strata",
                                                            "app.kubernetes.io/instance": n.config.run}
    return meta


def _security_context() -> Obj:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _pod_security(n: Names) -> Obj:
    return {"runAsNonRoot": True, "runAsUser": n.uid, "runAsGroup": n.uid, "fsGroup": n.uid,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _resources(cpu: str, memory: str, *, limit_cpu: str | None = None, limit_memory: str | None = None) -> Obj:
    return {"requests": {"cpu": cpu, "memory": memory},
            "limits": {"cpu": limit_cpu or cpu, "memory": limit_memory or memory}}


def _tls_flags(n: Names) -> list[str]:
    return ["--tls-ca", f"{n.tls_dir}/ca.crt", "--tls-cert", f"{n.tls_dir}/tls.crt", "--tls-key",
            f"{n.tls_dir}/tls.key", "--tls-token-file", f"{n.token_dir}/token"]


def _secret_volumes(n: Names, role: str) -> tuple[list[Obj], list[Obj]]:
    volumes = [{"name": "tls", "secret": {"secretName": n.tls_secret(role), "defaultMode": 0o440}},
               {"name": "run-token", "secret": {"secretName": n.token_secret, "defaultMode": 0o440}}]
    mounts = [{"name": "tls", "mountPath": n.tls_dir, "readOnly": True},
              {"name": "run-token", "mountPath": n.token_dir, "readOnly": True}]
    return volumes, mounts


def _scratch(shm: str | None) -> tuple[list[Obj], list[Obj]]:
    """/tmp (read-only root filesystem) and, for co-located workers, /dev/shm in memory (the pool's frames)."""
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}]
    mounts: list[Obj] = [{"name": "tmp", "mountPath": "/tmp"}]
    if shm:
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
    return volumes, mounts


def _grpc_probe(port: int, *, delay: int = 5) -> Obj:
    return {"grpc": {"port": port}, "initialDelaySeconds": delay, "periodSeconds": 10, "timeoutSeconds": 5,
            "failureThreshold": 6}


def _container(name: str, image: str, command: Sequence[str], *, ports: Sequence[tuple[str, int]],
               resources: Obj, mounts: Sequence[Obj], probe_port: int | None) -> Obj:
    container: Obj = {"name": name, "image": image, "imagePullPolicy": "Always", "command": list(command),
                      "ports": [{"name": p, "containerPort": port, "protocol": "TCP"} for p, port in ports],
                      "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                      "resources": resources, "securityContext": _security_context(), "volumeMounts": list(mounts)}
    if probe_port is not None:
        container["livenessProbe"] = _grpc_probe(probe_port, delay=30)
        container["readinessProbe"] = _grpc_probe(probe_port)
    return container


def _pod(n: Names, component: str, containers: list[Obj], volumes: list[Obj], *, affinity: Obj | None = None,
         grace: int = 60) -> Obj:
    spec: Obj = {"serviceAccountName": n.name(component), "automountServiceAccountToken": False,
                 "securityContext": _pod_security(n), "terminationGracePeriodSeconds": grace,
                 "containers": containers, "volumes": volumes}
    if affinity:
        spec["affinity"] = affinity
    return {"metadata": {"labels": n.labels(component)}, "spec": spec}


def _term(n: Names, component: str, topology: str) -> Obj:
    return {"labelSelector": {"matchLabels": n.labels(component)}, "topologyKey": topology}


ZONE = "topology.kubernetes.io/zone"
HOST = "kubernetes.io/hostname"


def _resume_wrapper(argv: Sequence[str], run_dir: str) -> list[str]:
    """A restarted pod continues its run: ``--resume`` once the run dir holds a checkpoint."""
    line = " ".join(shlex.quote(a) for a in argv)
    return ["sh", "-c", f'if [ -d {run_dir}/checkpoints ]; then exec {line} --resume; else exec {line}; fi']


# -- the objects -------------------------------------------------------------------------------------------------------


def namespace(n: Names) -> list[Obj]:
    """The namespace, with Pod Security Admission enforcing the restricted profile."""
    labels = {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/audit": "restricted",
              "app.kubernetes.io/name": "strata"}
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n.config.namespace, "labels": labels}}]


def service_accounts(n: Names) -> list[Obj]:
    """One ServiceAccount per component; none mounts an API token (strata never calls the API server)."""
    components = [c for c in n.components if c != "broker" or n.config.broker]
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(n, n.name(c), c),
             "automountServiceAccountToken": False} for c in components]


def learner(n: Names) -> list[Obj]:
    """The learner: one hybrid unit whose rank 0 serves the parameter server; decoupled over the env services."""
    c = n.config
    name = n.name("learner")
    argv = ["strata", "train", "--env", c.env, "--total-steps", str(c.total_steps), "--run-dir", n.run_dir,
            "--modes", "hybrid", "decoupled", "colocated", "--units", "1",
            "--num-envs", str(c.env_replicas * c.envs_per_service), "--env-services", n.envs_address,
            "--param-server-host", "0.0.0.0", "--param-server-port", str(n.param_port),
            "--param-server-health-port", str(n.param_health_port), *_tls_flags(n)]
    if c.learner_workers:
        argv += ["--workers-per-unit", str(c.learner_workers)]
    secret_vols, secret_mounts = _secret_volumes(n, "learner")
    scratch_vols, scratch_mounts = _scratch("1Gi" if c.learner_workers else None)
    run_vol = {"name": "run", "persistentVolumeClaim": {"claimName": name + "-run"}}
    mounts = [*secret_mounts, *scratch_mounts, {"name": "run", "mountPath": n.run_dir}]
    cpu = str(1 + c.learner_workers)
    container = _container("learner", c.cloud_image, _resume_wrapper(argv, n.run_dir),
                           ports=[("params", n.param_port), ("params-health", n.param_health_port)],
                           resources=_resources(cpu, "4Gi"), mounts=mounts, probe_port=n.param_health_port)
    pod = _pod(n, "learner", [container], [*secret_vols, *scratch_vols, run_vol])
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(n, name, "learner"),
                  "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                           "selector": {"matchLabels": n.labels("learner")}, "template": pod}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(n, name, "learner"),
               "spec": {"selector": n.labels("learner"),
                        "ports": [{"name": "params", "port": n.param_port, "targetPort": "params",
                                   "protocol": "TCP"}]}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(n, name + "-run", "learner"),
             "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}}
    return [deployment, service, claim]


def env_services(n: Names) -> list[Obj]:
    """Env services: a Deployment in the learner's zone, its autoscaler, and the headless Service."""
    c = n.config
    name = n.name("env-service")
    argv = ["strata", "envs", "serve", "--env", c.env, "--envs", str(c.envs_per_service), "--host", "0.0.0.0",
            "--port", str(n.env_port), "--health-port", str(n.env_health_port), *_tls_flags(n)]
    secret_vols, secret_mounts = _secret_volumes(n, "env")
    scratch_vols, scratch_mounts = _scratch(None)
    container = _container("env-service", c.env_image, argv,
                           ports=[("envs", n.env_port), ("envs-health", n.env_health_port)],
                           resources=_resources("1", "1Gi"), mounts=[*secret_mounts, *scratch_mounts],
                           probe_port=n.env_health_port)
    affinity = {
        # the seed's rule: chatty services share the learner's zone, or cross-zone latency eats the throughput
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": _term(n, "learner", ZONE)}]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 10, "podAffinityTerm": _term(n, "env-service", HOST)}]},
    }
    pod = _pod(n, "env-service", [container], [*secret_vols, *scratch_vols], affinity=affinity, grace=30)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(n, name, "env-service"),
                  "spec": {"replicas": c.env_replicas, "selector": {"matchLabels": n.labels("env-service")},
                           "template": pod}}
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": _meta(n, name, "env-service"),
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                    "minReplicas": c.env_replicas, "maxReplicas": c.env_max_replicas,
                    "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                        "type": "Utilization", "averageUtilization": c.env_cpu_target}}}]}}
    headless = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(n, name, "env-service"),
                "spec": {"clusterIP": "None", "selector": n.labels("env-service"),
                         "ports": [{"name": "envs", "port": n.env_port, "targetPort": "envs", "protocol": "TCP"}]}}
    return [deployment, hpa, headless]


def unit_argv(n: Names) -> list[str]:
    """The documented torchrun line of one unit pod (docs/architecture.md, "Running it")."""
    c = n.config
    return ["torchrun", "--nnodes", str(c.units), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", n.rdzv_endpoint, "--rdzv-id", n.name("unit"), "--max-restarts", "1",
            "--no-python", "strata", "train", "--env", c.env, "--total-steps", str(c.total_steps),
            "--run-dir", n.run_dir, "--modes", "hybrid", "colocated",
            "--workers-per-unit", str(max(1, c.workers_per_unit)), "--param-server-host", "0.0.0.0",
            "--param-server-port", str(n.param_port), *_tls_flags(n)]


def _unit_pod(n: Names, *, claim: str) -> Obj:
    c = n.config
    secret_vols, secret_mounts = _secret_volumes(n, "learner")
    scratch_vols, scratch_mounts = _scratch("1Gi")
    run_vol = {"name": "run", "persistentVolumeClaim": {"claimName": claim}}
    container = _container("unit", c.cloud_image, _resume_wrapper(unit_argv(n), n.run_dir),
                           ports=[("rdzv", n.rdzv_port), ("params", n.param_port)],
                           resources=_resources(str(1 + c.workers_per_unit), "4Gi"),
                           mounts=[*secret_mounts, *scratch_mounts, {"name": "run", "mountPath": n.run_dir}],
                           probe_port=None)  # torchrun restarts the whole group; a probe would kill one unit
    affinity = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [_term(n, "unit", HOST)]},
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": _term(n, "unit", ZONE)}]},
    }
    return _pod(n, "unit", [container], [*secret_vols, *scratch_vols, run_vol], affinity=affinity, grace=120)


UNIT_CHECKOV_SKIPS = {
    "checkov.io/skip1": "CKV_K8S_8=no liveness probe: a hung unit fails its collective within --collective-timeout-s "
                        "and torchrun restarts the whole group; a kubelet restart of one unit would break the group",
    "checkov.io/skip2": "CKV_K8S_9=no readiness probe: nothing is routed by readiness (the headless Service publishes "
                        "not-ready addresses for the rendezvous), and only rank 0 serves a port to probe",
}
"""The two checkov findings on the units, justified on the object itself (docs/kubernetes.md lists every finding)."""


def units(n: Names) -> list[Obj]:
    """Hybrid units: a StatefulSet (stable names; pod 0 hosts the rendezvous), its headless Service, the run volume."""
    c = n.config
    name = n.name("unit")
    claim: Obj = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": _meta(n, name + "-run", "unit"),
                  "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}}}
    if c.run_storage_class:
        claim["spec"]["storageClassName"] = c.run_storage_class
    headless = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(n, name, "unit"),
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": n.labels("unit"),
                         "ports": [{"name": "rdzv", "port": n.rdzv_port, "targetPort": "rdzv", "protocol": "TCP"},
                                   {"name": "params", "port": n.param_port, "targetPort": "params",
                                    "protocol": "TCP"}]}}
    meta = _meta(n, name, "unit")
    meta["annotations"] = UNIT_CHECKOV_SKIPS
    stateful = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta,
                "spec": {"serviceName": name, "replicas": c.units, "podManagementPolicy": "Parallel",
                         "selector": {"matchLabels": n.labels("unit")}, "template": _unit_pod(n, claim=name + "-run")}}
    return [stateful, headless, claim]


def pytorch_job(n: Names) -> list[Obj]:
    """The units as a Kubeflow PyTorchJob (the training operator sets the rendezvous and restarts replicas)."""
    c = n.config
    pod = _unit_pod(n, claim=n.name("unit") + "-run")
    container = pod["spec"]["containers"][0]
    container["name"] = "pytorch"  # the operator finds the training container by this name
    argv = unit_argv(n)
    cut = argv.index("--no-python")
    container["command"] = _resume_wrapper(["torchrun", "--nproc-per-node", "1", *argv[cut:]], n.run_dir)
    replica = {"restartPolicy": "OnFailure", "template": pod}
    specs = {"Master": {**replica, "replicas": 1}}
    if c.units > 1:
        specs["Worker"] = {**replica, "replicas": c.units - 1}
    return [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _meta(n, n.name("unit"), "unit"),
             "spec": {"elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": c.units, "maxReplicas": c.units,
                                        "maxRestarts": 1},
                      "pytorchReplicaSpecs": specs}}]


def broker(n: Names) -> list[Obj]:
    """Mosquitto with a TLS listener (8883) for edge nodes; password file and ACL as `strata broker config`."""
    c = n.config
    name = n.name("broker")
    conf = "\n".join([f"listener {n.broker_port}", f"cafile {n.tls_dir}/ca.crt", f"certfile {n.tls_dir}/tls.crt",
                      f"keyfile {n.tls_dir}/tls.key", "allow_anonymous false",
                      "password_file /mosquitto/auth/passwd", "acl_file /mosquitto/auth/acl",
                      "set_tcp_nodelay true", "persistence true", "persistence_location /mosquitto/data/",
                      "log_dest stdout", ""])
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(n, name, "broker"),
                  "data": {"mosquitto.conf": conf}}
    volumes = [{"name": "config", "configMap": {"name": name}},
               {"name": "tls", "secret": {"secretName": n.tls_secret("broker"), "defaultMode": 0o440}},
               {"name": "auth", "secret": {"secretName": name + "-auth", "defaultMode": 0o440}},
               {"name": "data", "emptyDir": {"sizeLimit": "1Gi"}}]
    mounts: list[Obj] = [{"name": "config", "mountPath": "/mosquitto/config", "readOnly": True},
              {"name": "tls", "mountPath": n.tls_dir, "readOnly": True},
              {"name": "auth", "mountPath": "/mosquitto/auth", "readOnly": True},
              {"name": "data", "mountPath": "/mosquitto/data"}]
    container = _container("broker", c.broker_image, ["mosquitto", "-c", "/mosquitto/config/mosquitto.conf"],
                           ports=[("mqtts", n.broker_port)], resources=_resources("500m", "512Mi"), mounts=mounts,
                           probe_port=None)
    for probe, delay in (("livenessProbe", 30), ("readinessProbe", 5)):
        container[probe] = {"tcpSocket": {"port": "mqtts"}, "initialDelaySeconds": delay, "periodSeconds": 10}
    container["env"] = []
    pod = _pod(n, "broker", [container], volumes, grace=30)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(n, name, "broker"),
                  "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                           "selector": {"matchLabels": n.labels("broker")}, "template": pod}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(n, name, "broker"),
               "spec": {"selector": n.labels("broker"),
                        "ports": [{"name": "mqtts", "port": n.broker_port, "targetPort": "mqtts", "protocol": "TCP"}]}}
    return [config_map, deployment, service]


def _from(n: Names, *components: str) -> list[Obj]:
    return [{"podSelector": {"matchLabels": n.labels(c)}} for c in components]


def _allow(n: Names, name: str, component: str, peers: list[Obj], ports: Sequence[int] = ()) -> Obj:
    rule: Obj = {"from": peers}
    if ports:
        rule["ports"] = [{"protocol": "TCP", "port": p} for p in ports]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(n, name),
            "spec": {"podSelector": {"matchLabels": n.labels(component)}, "policyTypes": ["Ingress"],
                     "ingress": [rule]}}


def network_policies(n: Names) -> list[Obj]:
    """Ingress rules: denied by default, then each allowed path.

    Env services take calls from the learner only; the parameter servers from the env services (policy pulls);
    units from each other (rendezvous, and gloo's ports, which are chosen at run time).
    """
    run = n.config.run
    deny = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(n, f"{run}-default-deny"),
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}}
    policies = [deny,
                _allow(n, f"{run}-envs-from-learner", "env-service", _from(n, "learner"), [n.env_port]),
                _allow(n, f"{run}-learner-params", "learner", _from(n, "env-service"), [n.param_port]),
                _allow(n, f"{run}-units-peers", "unit", _from(n, "unit")),
                _allow(n, f"{run}-units-params", "unit", _from(n, "env-service"), [n.param_port])]
    if n.config.broker:
        # edge nodes connect from outside the cluster: the broker's TLS and passwords guard it, not the network
        policies.append(_allow(n, f"{run}-broker-mqtts", "broker", [{"ipBlock": {"cidr": "0.0.0.0/0"}}],
                               [n.broker_port]))
    return policies


def cert_manager(n: Names) -> list[Obj]:
    """A CA Issuer over the run CA's Secret and one Certificate per role Secret (cert-manager fills them)."""
    run = n.config.run
    issuer = {"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": _meta(n, f"{run}-run-ca"),
              "spec": {"ca": {"secretName": f"{run}-run-ca"}}}
    certs = []
    for role, dns in n.hosts().items():
        spec = {"secretName": n.tls_secret(role), "duration": "2160h", "renewBefore": "360h",
                "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
                "usages": ["server auth", "client auth", "digital signature"], "dnsNames": dns,
                "uris": [f"spiffe://strata/{role}"], "issuerRef": {"name": f"{run}-run-ca", "kind": "Issuer"}}
        certs.append({"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
                      "metadata": _meta(n, n.tls_secret(role)), "spec": spec})
    return [issuer, *certs]


# -- rendering ---------------------------------------------------------------------------------------------------------


def base_files(config: K8sConfig) -> dict[str, list[Obj]]:
    """File name -> objects of the kustomize base."""
    n = Names(config)
    files = {"namespace.yaml": namespace(n), "serviceaccounts.yaml": service_accounts(n), "learner.yaml": learner(n),
             "envs.yaml": env_services(n), "units.yaml": units(n), "networkpolicies.yaml": network_policies(n)}
    if config.broker:
        files["broker.yaml"] = broker(n)
    return files


def render(config: K8sConfig) -> dict[str, str]:
    """Relative path -> file text of everything `strata infra k8s render` writes."""
    n = Names(config)
    out: dict[str, str] = {}
    base = base_files(config)
    for name, objs in base.items():
        out[f"base/{name}"] = to_yaml_documents(objs)
    out["base/kustomization.yaml"] = to_yaml_documents([{
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": list(base)}])
    units_name = n.name("unit")
    out["overlays/pytorchjob/pytorchjob.yaml"] = to_yaml_documents(pytorch_job(n))
    out["overlays/pytorchjob/kustomization.yaml"] = to_yaml_documents([{
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../../base", "pytorchjob.yaml"],
        "patches": [{"patch": to_yaml_documents([{"$patch": "delete", "apiVersion": "apps/v1", "kind": "StatefulSet",
                                                  "metadata": {"name": units_name,
                                                               "namespace": config.namespace}}])}]}])
    out["overlays/cert-manager/certificates.yaml"] = to_yaml_documents(cert_manager(n))
    out["overlays/cert-manager/kustomization.yaml"] = to_yaml_documents([{
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["../../base", "certificates.yaml"]}])
    return out


def certs_command(config: K8sConfig, out: str = "certs") -> str:
    """The `strata certs` line that makes the Secrets' material for these manifests' names."""
    hosts = Names(config).hosts()
    roles = " ".join(f"--role {role}={','.join(h)}" for role, h in hosts.items())
    return f"strata certs --out {out} --run {config.run} {roles}"


def write_manifests(config: K8sConfig, out: Path) -> list[Path]:
    """Write `render(config)` into `out`, which must not exist or be empty; return the files written.

    Raises:
        ConfigError: `out` holds files already (manifests are never merged into another folder's), or cannot be
            written.
    """
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"strata infra k8s render: --out {shown(str(out))} exists and is not an empty folder; "
                          "pass a new folder")
    missing = [p for p in (out, *out.parents) if not p.exists()]  # folders this call makes, deepest first
    written: list[Path] = []
    try:
        for rel, text in render(config).items():
            path = out / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    except OSError as exc:
        # nothing left behind: `out` was new or empty, so all of it is this call's
        if out.is_dir():
            for child in out.iterdir():
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        for folder in missing:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise ConfigError(f"strata infra k8s render: cannot write into {shown(str(out))}: {exc.strerror or exc}; "
                          "pass a writable --out folder") from None
    return written


# -- YAML --------------------------------------------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z_/$][A-Za-z0-9_./$-]*")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if value is None:
        return "null"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return json.dumps(text)  # a JSON string is a YAML double-quoted scalar


def _emit(value: Any, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, Mapping):
        for key, item in value.items():
            k = _scalar(key)
            if isinstance(item, Mapping) and item:
                lines.append(f"{pad}{k}:")
                _emit(item, indent + 2, lines)
            elif isinstance(item, list) and item:
                lines.append(f"{pad}{k}:")
                _emit(item, indent, lines)
            elif isinstance(item, str) and "\n" in item:
                lines.append(f"{pad}{k}: |")
                lines.extend(f"{pad}  {line}" if line else "" for line in item.rstrip("\n").split("\n"))
            else:
                lines.append(f"{pad}{k}: {_empty(item) if isinstance(item, Mapping | list) else _scalar(item)}")
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, Mapping) and item:
                sub: list[str] = []
                _emit(item, indent + 2, sub)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            elif isinstance(item, list) and item:
                sub = []
                _emit(item, indent + 2, sub)
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_empty(item) if isinstance(item, Mapping | list) else _scalar(item)}")
    else:
        lines.append(f"{pad}{_scalar(value)}")


def _empty(value: Mapping[str, Any] | list[Any]) -> str:
    return "{}" if isinstance(value, Mapping) else "[]"


def to_yaml(obj: Mapping[str, Any]) -> str:
    """One object as block-style YAML (strings quoted as JSON whenever a plain scalar could be misread)."""
    lines: list[str] = []
    _emit(obj, 0, lines)
    return "\n".join(lines) + "\n"


def to_yaml_documents(objs: Sequence[Mapping[str, Any]]) -> str:
    """Objects as a multi-document YAML stream."""
    return "---\n".join(to_yaml(o) for o in objs)
