"""`strata infra k8s render`: the manifests validate against Kubernetes' API schema and agree with each other."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from cloud.cli import build_parser
from infra._k8s import K8sConfig, Names, certs_command, render, to_yaml
from tests._cli import run_strata

K8S_VERSION = "1.37.0"
CONFIGS = {"default": K8sConfig(), "broker": K8sConfig(broker=True, namespace="rl", run="exp7", units=3,
                                                      env_replicas=3, run_storage_class="nfs")}


def objects(config: K8sConfig) -> dict[str, list[dict[str, Any]]]:
    return {path: list(yaml.safe_load_all(text)) for path, text in render(config).items()}


def base_objects(config: K8sConfig) -> list[dict[str, Any]]:
    found = objects(config)
    return [o for path, objs in found.items() if path.startswith("base/") and "kustomization" not in path
            for o in objs]


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def command_of(container: dict[str, Any]) -> list[str]:
    """The container's strata argv (inside the resume wrapper, after torchrun's --no-python)."""
    cmd = container["command"]
    if cmd[:2] == ["sh", "-c"]:
        cmd = shlex.split(cmd[2].split("else exec ", 1)[1].rsplit(";", 1)[0])
    if "--no-python" in cmd:
        cmd = cmd[cmd.index("--no-python") + 1:]
    return list(cmd)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("which", CONFIGS)
def test_every_rendered_object_validates_against_the_kubernetes_schema(which: str) -> None:
    import kubernetes_validate

    config = CONFIGS[which]
    checked = 0
    for objs in objects(config).values():
        for obj in objs:
            group = obj["apiVersion"].split("/")[0]
            if group in ("kustomize.config.k8s.io", "cert-manager.io"):
                continue  # no schema in the Kubernetes release: checked below
            if obj["kind"] == "PyTorchJob":  # a CRD: its pod templates are checked as v1 PodTemplates
                for replica in obj["spec"]["pytorchReplicaSpecs"].values():
                    kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata":
                                                  obj["metadata"], "template": replica["template"]},
                                                 K8S_VERSION, strict=True)
                    checked += 1
                continue
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            checked += 1
    assert checked >= 20


def test_the_schema_check_is_not_vacuous() -> None:
    import kubernetes_validate

    deployment = one(base_objects(K8sConfig()), "Deployment", "strata-envs")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}  # a typo
    with pytest.raises(kubernetes_validate.ValidationError, match="securityContex"):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


@pytest.mark.parametrize("which", CONFIGS)
def test_selectors_ports_and_secret_names_agree_across_objects(which: str) -> None:
    config = CONFIGS[which]
    n = Names(config)
    objs = base_objects(config)
    workloads = [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    accounts = {o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"}
    claims = {o["metadata"]["name"] for o in objs if o["kind"] == "PersistentVolumeClaim"}
    secrets = {n.tls_secret("learner"), n.tls_secret("env"), n.token_secret, n.tls_secret("broker"),
               n.name("broker") + "-auth"}
    for w in workloads:
        assert w["metadata"]["namespace"] == config.namespace
        pod = w["spec"]["template"]
        assert w["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        spec = pod["spec"]
        assert spec["serviceAccountName"] in accounts and spec["automountServiceAccountToken"] is False
        for volume in spec["volumes"]:
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] and sc["runAsNonRoot"] and not sc["allowPrivilegeEscalation"]
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert set(c["resources"]["requests"]) == set(c["resources"]["limits"]) == {"cpu", "memory"}
            assert not c["image"].endswith(":latest")
    for service in (o for o in objs if o["kind"] == "Service"):
        [target] = [w for w in workloads
                    if service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        names = {p["name"] for c in target["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= names

    envs = one(objs, "Deployment", n.name("env-service"))
    hpa = one(objs, "HorizontalPodAutoscaler", n.name("env-service"))
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": n.name("env-service")}
    assert hpa["spec"]["minReplicas"] == envs["spec"]["replicas"] == config.env_replicas
    headless = one(objs, "Service", n.name("env-service"))
    assert headless["spec"]["clusterIP"] == "None"

    # the learner finds the env services through the headless Service, and trusts the name their certificate has
    learner = one(objs, "Deployment", n.name("learner"))
    learner_argv = command_of(learner["spec"]["template"]["spec"]["containers"][0])
    host, port = flag(learner_argv, "--env-services").rsplit(":", 1)
    assert host == f"{headless['metadata']['name']}.{config.namespace}.svc.cluster.local"
    env_container = envs["spec"]["template"]["spec"]["containers"][0]
    env_argv = command_of(env_container)
    assert int(port) == int(flag(env_argv, "--port")) == headless["spec"]["ports"][0]["port"]
    assert f"--role env={host}" in certs_command(config)
    assert int(flag(learner_argv, "--num-envs")) == config.env_replicas * int(flag(env_argv, "--envs"))
    # probes hit the plaintext health-only ports the commands open
    assert env_container["livenessProbe"]["grpc"]["port"] == int(flag(env_argv, "--health-port"))
    learner_container = learner["spec"]["template"]["spec"]["containers"][0]
    assert learner_container["readinessProbe"]["grpc"]["port"] == int(flag(learner_argv, "--param-server-health-port"))


@pytest.mark.parametrize("which", CONFIGS)
def test_the_seeds_placement_rule_is_encoded(which: str) -> None:
    config = CONFIGS[which]
    n = Names(config)
    objs = base_objects(config)
    learner_labels = one(objs, "Deployment", n.name("learner"))["spec"]["template"]["metadata"]["labels"]
    envs = one(objs, "Deployment", n.name("env-service"))["spec"]["template"]["spec"]["affinity"]
    [zone] = envs["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert zone["podAffinityTerm"]["topologyKey"] == "topology.kubernetes.io/zone"
    assert zone["podAffinityTerm"]["labelSelector"]["matchLabels"] == learner_labels

    units = one(objs, "StatefulSet", n.name("unit"))
    unit_labels = units["spec"]["template"]["metadata"]["labels"]
    affinity = units["spec"]["template"]["spec"]["affinity"]
    [spread] = affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert spread == {"labelSelector": {"matchLabels": unit_labels}, "topologyKey": "kubernetes.io/hostname"}
    assert affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"][
        "topologyKey"] == "topology.kubernetes.io/zone"
    # torchrun's rendezvous is pod 0's stable name under the StatefulSet's headless Service
    headless = one(objs, "Service", units["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    argv = units["spec"]["template"]["spec"]["containers"][0]["command"][2]
    endpoint = f"{n.name('unit')}-0.{n.name('unit')}.{config.namespace}.svc.cluster.local:{n.rdzv_port}"
    assert f"--rdzv-endpoint {endpoint}" in argv and f"--nnodes {config.units}" in argv
    assert units["spec"]["replicas"] == config.units
    # co-located workers share their learner's pod, with /dev/shm in memory for the pool's frames
    learner_pod = one(objs, "Deployment", n.name("learner"))["spec"]["template"]["spec"]
    assert {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}} in learner_pod["volumes"]
    assert len(learner_pod["containers"]) == 1


@pytest.mark.parametrize("which", CONFIGS)
def test_only_the_learner_reaches_env_services(which: str) -> None:
    config = CONFIGS[which]
    n = Names(config)
    policies = [o for o in base_objects(config) if o["kind"] == "NetworkPolicy"]
    [deny] = [p for p in policies if p["spec"]["podSelector"] == {}]
    assert deny["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in deny["spec"]
    to_envs = [p for p in policies if p["spec"]["podSelector"].get("matchLabels") == n.labels("env-service")]
    assert len(to_envs) == 1
    [rule] = to_envs[0]["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": n.labels("learner")}}]
    assert rule["ports"] == [{"protocol": "TCP", "port": n.env_port}]


@pytest.mark.parametrize("which", CONFIGS)
def test_cert_manager_and_the_pytorchjob_overlay_match_the_base(which: str) -> None:
    config = CONFIGS[which]
    n = Names(config)
    found = objects(config)
    certs = [o for o in found["overlays/cert-manager/certificates.yaml"] if o["kind"] == "Certificate"]
    referenced = {v["secret"]["secretName"] for o in base_objects(config) if o["kind"] in ("Deployment", "StatefulSet")
                  for v in o["spec"]["template"]["spec"]["volumes"] if "secret" in v} - {n.token_secret,
                                                                                           n.name("broker") + "-auth"}
    assert {c["spec"]["secretName"] for c in certs} == referenced
    for c in certs:
        role = c["spec"]["secretName"][len(config.run) + 1:-len("-tls")]
        assert c["spec"]["uris"] == [f"spiffe://strata/{role}"]
        assert set(n.hosts().get(role, [n.fqdn(n.name("broker"))])) == set(c["spec"]["dnsNames"])
    [job] = found["overlays/pytorchjob/pytorchjob.yaml"]
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert sum(r["replicas"] for r in replicas.values()) == config.units
    assert replicas["Master"]["template"]["spec"]["containers"][0]["name"] == "pytorch"
    [kustomization] = found["overlays/pytorchjob/kustomization.yaml"]
    assert yaml.safe_load(kustomization["patches"][0]["patch"])["metadata"]["name"] == n.name("unit")


@pytest.mark.parametrize("which", CONFIGS)
def test_every_rendered_strata_command_parses_with_strata_s_own_cli(which: str) -> None:
    config = CONFIGS[which]
    parser = build_parser()
    seen = 0
    for o in base_objects(config):
        if o["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in o["spec"]["template"]["spec"]["containers"]:
            argv = command_of(c)
            if argv[0] != "strata":
                continue
            parser.parse_args(argv[1:])  # exits 2 (SystemExit) on a flag strata does not have
            seen += 1
    assert seen == 3


def test_the_yaml_writer_round_trips_tricky_strings() -> None:
    obj = {"a": ["yes", "no", "on", "0.0.0.0", "1", "a: b", "", "-x", "#c", "[x]", "$patch", "/tmp", 'q"uote'],
           "nested": [{"k": [1, 2.5, True, None]}, [], {}], "multi": "line one\nline two\n", "empty": {},
           "app.kubernetes.io/name": "strata"}
    assert yaml.safe_load(to_yaml(obj)) == obj


def test_render_refuses_a_folder_with_files_and_bad_values(tmp_path: Path) -> None:
    out = tmp_path / "k8s"
    ok = run_strata("infra", "k8s", "render", "--out", str(out))
    assert ok.returncode == 0, ok.stderr
    assert "strata certs --out certs --run strata --role learner=" in ok.stdout
    assert (out / "base" / "kustomization.yaml").is_file()
    for args, expected in [
        (("--out", str(out)), "exists and is not an empty folder"),
        (("--out", str(tmp_path / "a"), "--namespace", "Bad_NS"), "must be a DNS label"),
        (("--out", str(tmp_path / "b"), "--env-image", "strata-env:latest"), "with a fixed tag or digest"),
        (("--out", str(tmp_path / "c"), "--env-replicas", "5", "--env-max-replicas", "2"), "is below"),
    ]:
        bad = run_strata("infra", "k8s", "render", *args)
        assert bad.returncode == 2, bad.stdout
        [line] = bad.stderr.strip().splitlines()
        assert expected in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k8s"]  # nothing left behind


def test_the_printed_certs_line_makes_every_secret_the_manifests_mount(tmp_path: Path) -> None:
    """Run what `render` prints: `strata certs` must write a folder for each ROLE of the kubectl lines."""
    out = run_strata("infra", "k8s", "render", "--out", str(tmp_path / "k8s"), "--broker")
    assert out.returncode == 0, out.stderr
    [line] = [x for x in out.stdout.splitlines() if "TLS material" in x]
    certs = shlex.split(line.split("`")[1])
    assert certs[:2] == ["strata", "certs"]
    made = run_strata(*certs[1:], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    roles = line.split("for each ROLE in ", 1)[1].split(":", 1)[0].split()
    mounted = {v["secret"]["secretName"] for o in base_objects(K8sConfig(broker=True))
               if o["kind"] in ("Deployment", "StatefulSet") for v in o["spec"]["template"]["spec"]["volumes"]
               if "secret" in v and v["secret"]["secretName"].endswith("-tls")}
    assert {Names(K8sConfig()).tls_secret(r) for r in roles} == mounted
    for role in roles:
        assert sorted(p.name for p in (tmp_path / "certs" / role).iterdir()) == ["ca.crt", "tls.crt", "tls.key"]


def test_a_write_that_fails_half_way_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import infra._k8s as k8s

    # the second file cannot be written (its folder would be the first file): the first one must go too
    monkeypatch.setattr(k8s, "render", lambda config: {"base/a.yaml": "a: 1\n", "base/a.yaml/b.yaml": "b: 2\n"})
    out = tmp_path / "new" / "k8s"
    with pytest.raises(k8s.ConfigError, match="cannot write into"):
        k8s.write_manifests(K8sConfig(), out)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "empty").mkdir()
    with pytest.raises(k8s.ConfigError, match="cannot write into"):
        k8s.write_manifests(K8sConfig(), tmp_path / "empty")
    assert [p.name for p in tmp_path.iterdir()] == ["empty"] and list((tmp_path / "empty").iterdir()) == []
