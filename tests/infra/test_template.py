"""`strata infra template`: the same deployment as CloudFormation, checked with cfn-lint."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
from hypothesis import given, settings

from device import SigningKey
from infra._models import Artifact, DeployConfig, desired_resources
from infra._template import logical_id, template, write_template

# cfn-lint's console script lives next to the interpreter that installed it, which a worktree's venv may not be.
CFN_LINT = [sys.executable, "-c", "import sys; from cfnlint.runner import main; sys.exit(main())"]


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CFN_LINT, str(path)], capture_output=True, text=True, timeout=120)


def artifact(code: bytes) -> Artifact:
    digest = hashlib.sha256(code)
    return Artifact(path=Path("functions.zip"), sha256_b64=base64.b64encode(digest.digest()).decode(),
                    sha256_hex=digest.hexdigest(), zipped_bytes=len(code), unzipped_bytes=len(code))


def versions(t: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: r["Properties"] for k, r in t["Resources"].items() if r["Type"] == "AWS::Lambda::Version"}


def test_the_template_passes_cfn_lint_and_a_broken_one_does_not(tmp_path: Path) -> None:
    # A real public key: DeployConfig's trusted key is parsed now (the old placeholder PEM held no key).
    config = DeployConfig(stage="prod", edge_nodes=("node-a", "node-b"), reserved_concurrency=10,
                          trusted_public_key=SigningKey.generate().public_key.to_pem().decode())
    out = write_template(config, tmp_path / "stack.json", artifact(b"code"))
    result = lint(out)
    assert result.returncode == 0, result.stdout + result.stderr
    # The check has teeth: a timeout over Lambda's 900 s is caught.
    broken = json.loads(out.read_text())
    broken["Resources"][logical_id("Function", "strata-prod-rollout")]["Properties"]["Timeout"] = 1200
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    assert lint(tmp_path / "broken.json").returncode != 0


def test_the_template_holds_the_same_resources_as_the_plan() -> None:
    config = DeployConfig(stage="prod", edge_nodes=("node-a",), reserved_concurrency=3)
    t = template(config)
    types = sorted(r["Type"] for r in t["Resources"].values())
    assert types == sorted([
        "AWS::S3::Bucket", "AWS::S3::BucketPolicy", "AWS::IAM::Role", "AWS::Lambda::Function", "AWS::Lambda::Function",
        "AWS::Lambda::Version", "AWS::Lambda::Version", "AWS::Lambda::Alias", "AWS::Lambda::Alias",
        "AWS::SQS::Queue", "AWS::Lambda::EventInvokeConfig",
        "AWS::IoT::Policy", "AWS::IoT::Thing", "AWS::IoT::Certificate", "AWS::IoT::PolicyPrincipalAttachment",
        "AWS::IoT::ThingPrincipalAttachment"])
    fn = t["Resources"][logical_id("Function", "strata-prod-rollout")]["Properties"]
    model = next(r for r in desired_resources(config, account="1", region="us-east-1", artifacts=None)
                 if r.name == "strata-prod-rollout")
    assert (fn["Handler"], fn["ReservedConcurrentExecutions"], fn["Runtime"]) == (model.handler, 3, "python3.12")
    assert t["Resources"]["StageBucket"]["Properties"]["BucketName"] == {
        "Fn::Sub": "strata-prod-${AWS::AccountId}-${AWS::Region}"}
    role = t["Resources"]["ExecutionRole"]["Properties"]["Policies"][0]["PolicyDocument"]
    assert "arn:${AWS::Partition}:s3:::strata-prod-${AWS::AccountId}-${AWS::Region}/*" in json.dumps(role)


def test_a_version_changes_its_logical_id_when_the_code_or_the_configuration_changes() -> None:
    config = DeployConfig(stage="prod")
    one = versions(template(config, artifact(b"code v1")))
    assert len(one) == 2 and all(p["CodeSha256"] == artifact(b"code v1").sha256_b64 for p in one.values())
    same = versions(template(config, artifact(b"code v1")))
    new_code = versions(template(config, artifact(b"code v2")))
    new_memory = versions(template(DeployConfig(stage="prod", memory_mb=2048), artifact(b"code v1")))
    assert same == one  # an unchanged deployment publishes nothing
    assert not set(new_code) & set(one) and not set(new_memory) & set(one) and not set(new_code) & set(new_memory)
    t = template(config, artifact(b"code v2"))
    alias = t["Resources"][logical_id("Alias", "strata-prod-rollout")]["Properties"]
    assert alias["FunctionVersion"]["Fn::GetAtt"][0] in new_code  # the alias follows the new version
    assert t["Parameters"]["CodeKey"]["Default"] == artifact(b"code v2").key


SIMILAR = ("node-1", "node1", "node_1", "Node1", "NODE-1", "node--1", "no-de1")


@st.composite
def similar_names(draw: st.DrawFn) -> list[str]:
    """Node ids that differ only in case and separators, so their alphanumeric forms collide."""
    base = draw(st.text(alphabet="abn01", min_size=1, max_size=5))
    def variant() -> st.SearchStrategy[str]:
        chars = st.tuples(*[st.tuples(st.sampled_from([c.lower(), c.upper()]), st.sampled_from(["", "-", "_"]))
                            for c in base])
        return chars.map(lambda parts: "".join(c + sep for c, sep in parts).rstrip("-_"))
    return draw(st.lists(variant(), min_size=1, max_size=8, unique=True))


def node_resources(t: dict[str, Any]) -> dict[str, list[Any]]:
    by_type: dict[str, list[Any]] = {}
    for r in t["Resources"].values():
        by_type.setdefault(r["Type"], []).append(r["Properties"])
    return by_type


@settings(max_examples=60, deadline=None)
@given(similar_names())
def test_every_node_gets_its_own_thing_certificate_and_csr_whatever_its_name_normalises_to(nodes: list[str]) -> None:
    t = template(DeployConfig(stage="prod", edge_nodes=tuple(nodes)))
    by_type = node_resources(t)
    things = sorted(p["ThingName"] for p in by_type["AWS::IoT::Thing"])
    assert things == sorted(f"strata-prod_{n}" for n in nodes)
    assert sorted(p["PolicyName"] for p in by_type["AWS::IoT::Policy"]) == things
    for kind in ("AWS::IoT::Certificate", "AWS::IoT::PolicyPrincipalAttachment", "AWS::IoT::ThingPrincipalAttachment"):
        assert len(by_type[kind]) == len(nodes), kind
    csrs = [k for k in t["Parameters"] if k.startswith("Csr")]
    assert len(csrs) == len(nodes)
    # every certificate is issued from its own CSR and attached to its own thing and policy
    assert len({p["CertificateSigningRequest"]["Ref"] for p in by_type["AWS::IoT::Certificate"]}) == len(nodes)
    assert len({p["ThingName"]["Ref"] for p in by_type["AWS::IoT::ThingPrincipalAttachment"]}) == len(nodes)
    assert len({p["PolicyName"]["Ref"] for p in by_type["AWS::IoT::PolicyPrincipalAttachment"]}) == len(nodes)


def test_similar_node_names_make_a_cfn_lint_clean_template_with_one_thing_each(tmp_path: Path) -> None:
    out = write_template(DeployConfig(stage="prod", edge_nodes=SIMILAR), tmp_path / "stack.json", artifact(b"c"))
    t = json.loads(out.read_text())
    assert len(node_resources(t)["AWS::IoT::Thing"]) == len(SIMILAR)
    assert len([k for k in t["Parameters"] if k.startswith("Csr")]) == len(SIMILAR)
    result = lint(out)
    assert result.returncode == 0, result.stdout + result.stderr
