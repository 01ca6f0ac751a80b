"""A recorder with a token: calls without it are refused, with it they work, and the token is never printed."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from steprec.exporter import shutdown_pipelines
from steprec.query import RecorderClient, RecorderUnavailable
from steprec.recorder.daemon.process import RecorderProcess

from .agents import echo_agent


@pytest.fixture
def guarded(tmp_path: Path):
    token = secrets.token_urlsafe(24)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    process = RecorderProcess(tmp_path / "recorder", extra_args=("--token-file", str(token_file))).start()
    try:
        yield process, token
    finally:
        shutdown_pipelines()
        process.stop()


async def test_calls_without_the_token_are_unauthenticated(guarded) -> None:
    recorder, token = guarded
    async with grpc.aio.insecure_channel(recorder.endpoint) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await logs_service_pb2_grpc.LogsServiceStub(channel).Export(logs_service_pb2.ExportLogsServiceRequest())
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as wrong:
            await logs_service_pb2_grpc.LogsServiceStub(channel).Export(
                logs_service_pb2.ExportLogsServiceRequest(), metadata=(("authorization", "Bearer nope"),)
            )
        assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED and token not in wrong.value.details()
        # Health stays open for container probes.
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    async with RecorderClient(recorder.endpoint) as anonymous:
        with pytest.raises(PermissionError, match="refused"):
            await anonymous.list_runs()
        # The streamed reads too: SQL, exports, media, the columnar tree.
        for read in (anonymous.sql("SELECT 1"), anonymous.fetch_media("media+sha256://" + "0" * 64),
                     anonymous.descendants("any-run")):  # fmt: skip
            with pytest.raises(PermissionError, match="refused"):
                await read
        with pytest.raises(PermissionError, match="refused"):
            _ = [batch async for batch in anonymous.iter_view("runs")]


async def test_with_the_token_everything_works_and_it_is_never_logged(guarded, tmp_path: Path) -> None:
    recorder, token = guarded
    agent = echo_agent(recorder.endpoint, calls=2, token=token, journal_dir=tmp_path / "journal")
    result = await agent.run("go", conversation_id="conv-token")
    async with RecorderClient(recorder.endpoint, token=token) as client:
        (run,) = await client.list_runs(conversation_id="conv-token")
        assert run.run_id == result.run_id and run.outcome == "completed"
    assert token not in repr(agent.root_capability)
    shutdown_pipelines()
    recorder.stop()
    assert token not in recorder.log_path.read_text()


async def test_an_agent_without_the_token_is_not_stored_and_not_held_up(guarded, tmp_path: Path) -> None:
    recorder, token = guarded
    result = await echo_agent(recorder.endpoint, calls=1, journal_dir=tmp_path / "journal").run(
        "go", conversation_id="c"
    )
    assert result.output == "saw 1 returns"  # refused delivery journals; the agent is not failed
    async with RecorderClient(recorder.endpoint, token=token) as client:
        assert await client.list_runs(conversation_id="c") == []


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with openssl."""
    folder = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=steprec test CA",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=folder)  # fmt: skip
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=folder)  # fmt: skip
        (folder / f"{name}.ext").write_text(extension + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=folder)  # fmt: skip
    return folder


def _tls_recorder(tmp_path: Path, pki: Path, *, mutual: bool) -> RecorderProcess:
    args = ("--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"))
    if mutual:
        args += ("--tls-client-ca", str(pki / "ca.pem"))
    return RecorderProcess(tmp_path / "recorder", extra_args=args).start()


async def test_tls_records_and_reads_over_an_encrypted_channel(tmp_path: Path, certificates: Path) -> None:
    recorder = _tls_recorder(tmp_path, certificates, mutual=False)
    try:
        assert recorder.endpoint.startswith("https://127.0.0.1:")
        agent = echo_agent(recorder.endpoint, calls=1, tls_ca=certificates / "ca.pem", journal_dir=tmp_path / "journal")
        await agent.run("go", conversation_id="conv-tls")
        async with RecorderClient(recorder.endpoint, tls_ca=certificates / "ca.pem") as client:
            (run,) = await client.list_runs(conversation_id="conv-tls")
            assert run.outcome == "completed"
        plain = recorder.endpoint.replace("https://", "")
        async with RecorderClient(plain, timeout_seconds=2) as plaintext:
            with pytest.raises(RecorderUnavailable):
                await plaintext.list_runs()
    finally:
        shutdown_pipelines()
        recorder.stop()


async def test_mutual_tls_refuses_a_client_without_a_certificate(tmp_path: Path, certificates: Path) -> None:
    recorder = _tls_recorder(tmp_path, certificates, mutual=True)
    ca, cert, key = (certificates / n for n in ("ca.pem", "client.pem", "client.key"))
    try:
        async with RecorderClient(recorder.endpoint, tls_ca=ca, timeout_seconds=2) as anonymous:
            with pytest.raises(RecorderUnavailable):
                await anonymous.list_runs()
        async with RecorderClient(recorder.endpoint, tls_ca=ca, tls_cert=cert, tls_key=key) as client:
            assert await client.list_runs() == []
        agent = echo_agent(
            recorder.endpoint, calls=1, tls_ca=ca, tls_cert=cert, tls_key=key, journal_dir=tmp_path / "s"
        )
        await agent.run("go", conversation_id="conv-mtls")
        async with RecorderClient(recorder.endpoint, tls_ca=ca, tls_cert=cert, tls_key=key) as client:
            assert len(await client.list_runs(conversation_id="conv-mtls")) == 1
    finally:
        shutdown_pipelines()
        recorder.stop()


def test_the_browser_is_served_over_the_recorders_tls(tmp_path: Path, certificates: Path) -> None:
    """Same certificate as gRPC; with a client CA, a browser without a client certificate gets no page."""
    ca, cert, key = (certificates / n for n in ("ca.pem", "client.pem", "client.key"))
    for mutual in (False, True):
        recorder = _tls_recorder(tmp_path / str(mutual), certificates, mutual=mutual)
        try:
            assert recorder.ui_url.startswith("https://127.0.0.1:")
            trusting = ssl.create_default_context(cafile=ca)
            if mutual:
                with pytest.raises(OSError):
                    urllib.request.urlopen(recorder.ui_url + "api/runs", context=trusting, timeout=10).read()
                trusting.load_cert_chain(cert, key)
            with urllib.request.urlopen(recorder.ui_url + "api/runs", context=trusting, timeout=10) as answer:
                assert json.loads(answer.read()) == {"runs": [], "next": None}
        finally:
            recorder.stop()


def _steprec(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "steprec.query.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


async def test_the_commands_take_a_token_file_and_tls_options(guarded, tmp_path: Path, certificates: Path) -> None:
    recorder, token = guarded
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("STEPREC_")}
    (tmp_path / "cli-token").write_text(token + "\n")
    at = ("--endpoint", recorder.endpoint)
    anonymous, with_token, missing_file = await asyncio.gather(
        asyncio.to_thread(_steprec, "runs", *at, env=clean_env),
        asyncio.to_thread(
            _steprec,
            "sql",
            "SELECT count(*) AS n FROM runs",
            "--json",
            *at,
            "--token-file",
            str(tmp_path / "cli-token"),
            env=clean_env,
        ),  # fmt: skip
        asyncio.to_thread(_steprec, "runs", *at, "--token-file", str(tmp_path / "nope"), env=clean_env),
    )
    assert anonymous.returncode == 5 and "refused" in anonymous.stderr
    assert with_token.returncode == 0 and json.loads(with_token.stdout) == [{"n": 0}], with_token.stderr
    assert missing_file.returncode == 2 and "cannot read --token-file" in missing_file.stderr
    assert token not in anonymous.stderr + with_token.stderr + missing_file.stderr

    mutual = _tls_recorder(tmp_path / "mtls", certificates, mutual=True)
    try:
        pki = [f"--tls-{name}={certificates / file}" for name, file in
               (("ca", "ca.pem"), ("cert", "client.pem"), ("key", "client.key"))]  # fmt: skip
        listed = await asyncio.to_thread(_steprec, "runs", "--json", "--endpoint", mutual.endpoint, *pki, env=clean_env)
        assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    finally:
        mutual.stop()
