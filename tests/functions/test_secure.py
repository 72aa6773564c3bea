"""The secure service plane on loopback: mutual TLS, certificate roles and the run token, checked per call."""

from __future__ import annotations

import datetime
import logging
import os
import re
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from device import ConfigError
from device._pki import TLSFileError, check_tls_files, issue_run_certificates, read_token, role_of, spiffe_id
from functions._envservice import EnvService, EnvServiceClient, EnvServiceConfig, EnvServiceError
from functions._secure import (
    ACCESS,
    PLAINTEXT,
    TLS_LAYOUT,
    ServicePlaneError,
    ServiceTLS,
    allowed_roles,
    check_listen,
    is_loopback,
    service_tls_from,
)
from tests._cli import STRATA, run_strata

# A documentation address (RFC 5737 TEST-NET-1): never dialled, the refusals below come before any connection.
OFF_LOOPBACK = "192.0.2.1"


def role_tls(run: Path, role: str, *, token: bool = True, ca: Path | None = None) -> ServiceTLS:
    return ServiceTLS(tls_ca=str(ca or run / "ca.crt"), tls_cert=str(run / role / "tls.crt"),
                      tls_key=str(run / role / "tls.key"), tls_token_file=str(run / "token") if token else "")


@pytest.fixture(scope="module")
def run_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs") / "run"
    issue_run_certificates(out, roles={"learner": [], "env": []}, run="test")
    return out


@pytest.fixture(scope="module")
def other_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another run's CA and certificates (same roles): a stranger to `run_certs`."""
    out = tmp_path_factory.mktemp("certs") / "other"
    issue_run_certificates(out, roles={"learner": [], "env": []}, run="other")
    return out


@pytest.fixture(scope="module")
def secure_service(run_certs: Path) -> Iterator[EnvService]:
    service = EnvService(EnvServiceConfig(envs=2, tls=role_tls(run_certs, "env"), health_port=0)).start()
    yield service
    service.stop()


# -- certificates ----------------------------------------------------------------------------------------------------


def test_run_certificates_name_their_role_and_hosts_and_keep_keys_private(tmp_path: Path) -> None:
    # 10.9.0.x here are names written into certificates (a host's address inside a test's network namespace), never
    # a network target: nothing connects anywhere in this test.
    written = issue_run_certificates(tmp_path / "c", roles={"env": ["10.9.0.2", "envs.strata.svc"]}, run="r1")
    material = check_tls_files(written.ca_cert, written.roles["env"] / "tls.crt", written.roles["env"] / "tls.key",
                               call="test")
    assert material.role == "env"
    assert {"10.9.0.2", "envs.strata.svc", "127.0.0.1", "localhost"} <= set(material.hosts)
    for secret in (written.ca_key, written.token, written.roles["env"] / "tls.key"):
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret
    assert len(read_token(written.token, call="test")) >= 32
    # a second call adds a role under the same CA and token, and never overwrites one
    ca_before, token_before = written.ca_cert.read_bytes(), written.token.read_bytes()
    more = issue_run_certificates(tmp_path / "c", roles={"learner": ["10.9.0.1"]}, run="r1")
    assert (more.ca_cert.read_bytes(), more.token.read_bytes()) == (ca_before, token_before)
    check_tls_files(more.ca_cert, more.roles["learner"] / "tls.crt", more.roles["learner"] / "tls.key", call="test")
    with pytest.raises(TLSFileError, match="already exists; certificates are never overwritten"):
        issue_run_certificates(tmp_path / "c", roles={"env": []})


def test_spiffe_ids_round_trip() -> None:
    assert role_of(spiffe_id("env")) == "env"
    assert role_of("spiffe://example.org/env") is None
    assert role_of("spiffe://strata/env/extra") is None


def test_bad_tls_files_are_one_line_each(tmp_path: Path, run_certs: Path, other_certs: Path) -> None:
    ca, cert, key = run_certs / "ca.crt", run_certs / "env" / "tls.crt", run_certs / "env" / "tls.key"
    with pytest.raises(TLSFileError, match="was not issued by the CA in --tls-ca"):
        check_tls_files(other_certs / "ca.crt", cert, key, call="t")
    with pytest.raises(TLSFileError, match="is not the key of --tls-cert"):
        check_tls_files(ca, cert, run_certs / "learner" / "tls.key", call="t")
    not_pem = tmp_path / "x.pem"
    not_pem.write_text("hello")
    with pytest.raises(TLSFileError, match="is not a PEM file"):
        check_tls_files(ca, not_pem, key, call="t")
    with pytest.raises(TLSFileError, match="is not a file"):
        check_tls_files(tmp_path / "missing.crt", cert, key, call="t")
    expired = tmp_path / "expired.crt"
    expired.write_bytes(_expired_copy(run_certs))
    with pytest.raises(TLSFileError, match="not now; issue a new one"):
        check_tls_files(ca, expired, key, call="t")
    short = tmp_path / "token"
    short.write_text("abc\n")
    with pytest.raises(TLSFileError, match="at least 16 printable"):
        read_token(short, call="t")


def _expired_copy(run: Path) -> bytes:
    """The env certificate's key in a certificate the run CA signed, valid only last year."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    ca_key = serialization.load_pem_private_key((run / "ca.key").read_bytes(), password=None)
    ca = x509.load_pem_x509_certificate((run / "ca.crt").read_bytes())
    leaf = x509.load_pem_x509_certificate((run / "env" / "tls.crt").read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(leaf.subject).issuer_name(ca.subject).public_key(leaf.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=400))
            .not_valid_after(now - datetime.timedelta(days=35)).sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    return cert.public_bytes(serialization.Encoding.PEM)


def test_strata_certs_writes_the_secret_layout_and_refuses_bad_input(tmp_path: Path) -> None:
    # 10.9.0.1 is only a name in a certificate (no connection is made).
    out = tmp_path / "certs"
    ok = run_strata("certs", "--out", str(out), "--role", "learner=10.9.0.1", "--role", "env=envs.strata.svc")
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in (out / "env").iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert f"--tls-cert {out}/env/tls.crt" in ok.stdout
    for args, expected in [
        (("--role", "env=1.2.3.4"), "already exists; certificates are never overwritten"),
        (("--role", "admin=1.2.3.4"), "the role must be one of learner, env"),
        (("--role", "learner=bad..name"), "is neither an IP address nor a DNS name"),
        (("--role", "learner=a", "--role", "learner=b"), "is given twice"),
    ]:
        bad = run_strata("certs", "--out", str(tmp_path / ("x" if "admin" in args[1] else "certs")), *args)
        assert bad.returncode == 2, bad.stdout
        [line] = bad.stderr.strip().splitlines()
        assert expected in line and "Traceback" not in line


# -- the option set ---------------------------------------------------------------------------------------------------


def test_half_a_tls_trio_is_refused() -> None:
    with pytest.raises(ServicePlaneError, match=re.escape("--tls-cert, --tls-key missing")):
        ServiceTLS(tls_ca="ca.crt")


def test_environment_file_and_flags_layer_the_one_option_set(tmp_path: Path) -> None:
    for name in ("env/ca.crt", "env/tls.crt", "env/tls.key", "flag/tls.crt", "ca.crt"):  # each layer's files exist
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("pem\n")
    env = {"STRATA_TLS_CA": f"{tmp_path}/env/ca.crt", "STRATA_TLS_CERT": f"{tmp_path}/env/tls.crt",
           "STRATA_TLS_KEY": f"{tmp_path}/env/tls.key",
           "STRATA_PARENT_PID": "1"}  # other STRATA_ variables are not this layout's business
    assert service_tls_from({}, env).tls_cert == f"{tmp_path}/env/tls.crt"
    assert service_tls_from({"tls_cert": f"{tmp_path}/flag/tls.crt"}, env).tls_cert == f"{tmp_path}/flag/tls.crt"
    conf = tmp_path / "plane.toml"
    conf.write_text('[tls]\ntls_ca = "ca.crt"\ntls_cert = "env/tls.crt"\ntls_key = "env/tls.key"\n'
                    "insecure_plaintext_off_loopback = false\n")
    from_file = service_tls_from({}, {}, file=conf)
    assert from_file.tls_ca == str(tmp_path / "ca.crt")  # relative to the file
    assert service_tls_from({}, {"STRATA_INSECURE_PLAINTEXT_OFF_LOOPBACK": "yes"}).insecure_plaintext_off_loopback
    with pytest.raises(ConfigError, match="unknown environment variable STRATA_TLS_CAFILE"):
        service_tls_from({}, {"STRATA_TLS_CAFILE": "x"})
    assert set(TLS_LAYOUT.groups["tls"]) == {"tls_ca", "tls_cert", "tls_key", "tls_token_file",
                                             "insecure_plaintext_off_loopback"}


def test_the_access_table_names_every_method_of_every_service() -> None:
    from cloud.replay._proto import strata_replay_pb2
    from functions._proto import strata_env_pb2, strata_params_pb2

    for module in (strata_env_pb2, strata_params_pb2, strata_replay_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            assert service.full_name in ACCESS
            for method in service.methods:
                roles = allowed_roles(f"/{service.full_name}/{method.name}")
                assert roles, f"{service.full_name}/{method.name} would be refused to everybody"
    assert allowed_roles("/grpc.health.v1.Health/Check") is None
    assert allowed_roles("/strata.params.v1.ParameterServer/Push") == ("learner",)


def test_loopback_is_recognised() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "", "::", OFF_LOOPBACK, "envs.strata.svc"]))


# -- plaintext off loopback ------------------------------------------------------------------------------------------


def test_plaintext_off_loopback_is_refused_before_any_env_is_made() -> None:
    with pytest.raises(ServicePlaneError, match=re.escape("refusing to listen on '0.0.0.0' without TLS")):
        EnvService(EnvServiceConfig(host="0.0.0.0", envs=1))
    with pytest.raises(ServicePlaneError, match=re.escape("refusing to connect to '192.0.2.1:50051' without TLS")):
        EnvServiceClient(f"{OFF_LOOPBACK}:50051")


def test_the_opt_out_is_loud(capsys: pytest.CaptureFixture[str]) -> None:
    check_listen("0.0.0.0", ServiceTLS(insecure_plaintext_off_loopback=True).load("t"), call="strata envs serve")
    err = capsys.readouterr().err
    assert "WARNING: INSECURE: plaintext gRPC on 0.0.0.0" in err
    check_listen("127.0.0.1", PLAINTEXT.load("t"), call="t")  # loopback stays as it was: silent
    assert capsys.readouterr().err == ""


def test_strata_envs_serve_refuses_a_public_bind_in_one_line() -> None:
    result = run_strata("envs", "serve", "--host", "0.0.0.0", "--envs", "1", "--duration", "1")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "refusing to listen on '0.0.0.0' without TLS" in line and "--insecure-plaintext-off-loopback" in line


# -- calls -------------------------------------------------------------------------------------------------------------


def test_a_learner_with_the_run_certificate_and_token_steps_envs(secure_service: EnvService, run_certs: Path) -> None:
    client = EnvServiceClient(secure_service.address, tls=role_tls(run_certs, "learner"))
    try:
        assert client.spec()["num_envs"] == 2
        client.reset(seed=1)
        out = client.step(np.zeros(2, dtype=np.int64))
        assert out["rewards"].tolist() == [1.0, 1.0]
    finally:
        client.close()


@pytest.mark.parametrize(("who", "expected"), [
    ("env-role", "is not of a role that may call it (learner)"),
    ("no-token", "the call carries no per-run token"),
    ("wrong-token", "the call carries a wrong per-run token"),
])
def test_a_peer_of_the_wrong_role_or_without_the_token_is_refused_on_both_sides(
        who: str, expected: str, secure_service: EnvService, run_certs: Path, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    tls = {"env-role": role_tls(run_certs, "env"), "no-token": role_tls(run_certs, "learner", token=False)}.get(who)
    if tls is None:
        wrong = tmp_path / "token"
        wrong.write_text("x" * 43 + "\n")
        tls = ServiceTLS(tls_ca=str(run_certs / "ca.crt"), tls_cert=str(run_certs / "learner" / "tls.crt"),
                         tls_key=str(run_certs / "learner" / "tls.key"), tls_token_file=str(wrong))
    client = EnvServiceClient(secure_service.address, tls=tls)
    caplog.set_level(logging.WARNING, logger="strata.service_plane")
    try:
        with pytest.raises(EnvServiceError, match=re.escape(expected)) as info:
            client.step(np.zeros(2, dtype=np.int64))
        assert len(str(info.value).splitlines()) == 1
        # grpc.health.v1 stays open to any peer that completed the handshake (probes carry no token)
        assert client.health(5.0)
    finally:
        client.close()
    [line] = [r.getMessage() for r in caplog.records if "refused /strata.env.v1.EnvService/Step" in r.getMessage()]
    assert expected in line


@pytest.mark.parametrize("who", ["plaintext", "another run's certificate"])
def test_a_client_without_a_certificate_of_the_run_is_refused_at_the_handshake(
        who: str, secure_service: EnvService, other_certs: Path, run_certs: Path, tmp_path: Path) -> None:
    # the stranger trusts both CAs (so the server is the one that refuses) but presents another run's certificate
    both = tmp_path / "both.crt"
    both.write_bytes((run_certs / "ca.crt").read_bytes() + (other_certs / "ca.crt").read_bytes())
    tls = PLAINTEXT if who == "plaintext" else role_tls(other_certs, "learner", token=False, ca=both)
    client = EnvServiceClient(secure_service.address, tls=tls, timeout_s=5.0)
    try:
        ok, why = client.check_health(5.0, wait_for_ready=False)
        assert not ok
        assert "UNAVAILABLE" in why and "closes" in why
        with pytest.raises(EnvServiceError):
            client.spec()
    finally:
        client.close()


def test_a_learner_refuses_a_service_of_another_run(secure_service: EnvService, other_certs: Path) -> None:
    client = EnvServiceClient(secure_service.address, tls=role_tls(other_certs, "learner", token=False))
    try:
        with pytest.raises(EnvServiceError, match=re.escape("was not issued by --tls-ca (another run's CA?)")):
            client.spec()
    finally:
        client.close()


def test_the_plaintext_health_port_answers_probes_and_nothing_else(secure_service: EnvService) -> None:
    probe = EnvServiceClient(f"127.0.0.1:{secure_service.health_port}")
    try:
        assert probe.check_health(5.0) == (True, "SERVING")
        with pytest.raises(EnvServiceError, match="Method not found"):
            probe.spec()
    finally:
        probe.close()


def test_a_token_alone_guards_a_loopback_service(run_certs: Path) -> None:
    token_only = ServiceTLS(tls_token_file=str(run_certs / "token"))
    service = EnvService(EnvServiceConfig(envs=1, tls=token_only)).start()
    try:
        with_token = EnvServiceClient(service.address, tls=token_only)
        assert with_token.spec()["num_envs"] == 1
        with_token.close()
        without = EnvServiceClient(service.address)
        with pytest.raises(EnvServiceError, match="no per-run token"):
            without.spec()
        without.close()
    finally:
        service.stop()


def test_one_line_on_both_sides_through_the_cli(run_certs: Path, tmp_path: Path) -> None:
    """`strata envs serve` over mutual TLS; `strata envs health` without a certificate: each side says it once."""
    env_files = ["--tls-ca", str(run_certs / "ca.crt"), "--tls-cert", str(run_certs / "env" / "tls.crt"),
                 "--tls-key", str(run_certs / "env" / "tls.key")]
    log = tmp_path / "serve.err"
    with log.open("w") as err:
        proc = subprocess.Popen([STRATA, "envs", "serve", "--envs", "1", *env_files], stdout=subprocess.PIPE,
                                stderr=err, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "over mutual TLS on 127.0.0.1:" in line, line
        address = line.rsplit(" on ", 1)[1].strip()
        refused = run_strata("envs", "health", address, "--timeout", "10")
        assert refused.returncode == 1
        [client_line] = [x for x in refused.stderr.splitlines() if x.startswith("strata envs health:")]
        assert "closes plaintext clients" in client_line
        good = run_strata("envs", "health", address, "--tls-ca", str(run_certs / "ca.crt"), "--tls-cert",
                          str(run_certs / "learner" / "tls.crt"), "--tls-key", str(run_certs / "learner" / "tls.key"))
        assert good.returncode == 0 and "SERVING" in good.stdout, good.stderr
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stdout.close()  # type: ignore[union-attr]
    server_lines = [x for x in log.read_text().splitlines() if "Handshake failed" in x]
    assert len(server_lines) == 1, log.read_text()  # grpc core's line for the refused handshake


def test_the_run_token_file_is_checked_before_work(tmp_path: Path) -> None:
    result = run_strata("envs", "serve", "--envs", "1", "--duration", "1", "--tls-token-file",
                        str(tmp_path / "missing"))
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "--tls-token-file" in line and "does not exist" in line
    assert os.listdir(tmp_path) == []
