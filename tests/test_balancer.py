"""docker/nginx-grpc.conf, the shipped load balancer of a recorder pool, run by Debian's nginx in front of
two real recorders: agents record through it, reads and the health check go through it, and its RPCs
stay on one recorder per connection while connections spread over both.

The config under test is the shipped file, rendered only where a test must differ from compose: the
upstream servers (recorder-1:4317 and recorder-2:4317 there, two recorders on free loopback ports here),
the listen port, and nginx's temp folders, put under tmp_path so that nothing outside it is written.
The recorders run in file mode, so each holds only the share of the records nginx sent it; that is
enough to test the balancer (a real pool runs in lake mode, docs/lake.md).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from steprec.exporter import shutdown_pipelines
from steprec.query import RecorderClient
from steprec.recorder.daemon.process import RecorderProcess

from .agents import echo_agent

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "docker" / "nginx-grpc.conf"
RUNS = 6
CONNECTIONS = 16
"""Separate connections, each hashed to a recorder: all on one by chance once in 2**15 runs."""


def nginx_program() -> str:
    """Debian's nginx lives in /usr/sbin, which a user's PATH may lack."""
    found = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
                                           if Path(p).exists()), None)  # fmt: skip
    if found is None:
        pytest.fail("nginx is not installed: `python3 scripts/dev.py test` installs Debian's nginx "
                    "package, or run `apt-get install nginx`")  # fmt: skip
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def replace_once(pattern: str, replacement: str, text: str) -> str:
    rendered, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    assert count == 1, f"docker/nginx-grpc.conf should have one line matching {pattern!r}, has {count}"
    return rendered


def render(upstreams: list[str], port: int, prefix: Path) -> str:
    """The shipped config with the test's recorders, port and temp folders."""
    text = CONFIG.read_text()
    for number, endpoint in enumerate(upstreams, start=1):
        text = replace_once(rf"^(\s*server\s+)recorder-{number}:4317\b", rf"\g<1>{endpoint}", text)
    assert not re.search(r"^\s*server\s+recorder-\d", text, flags=re.MULTILINE), "an upstream left unrendered"
    text = replace_once(r"^(\s*listen\s+)4317\b", rf"\g<1>127.0.0.1:{port}", text)
    temp = "".join(f"    {kind}_temp_path {prefix / kind};\n" for kind in ("client_body", "proxy", "fastcgi",
                                                                             "uwsgi", "scgi"))  # fmt: skip
    return replace_once(r"^http \{\n", "http {\n" + temp, text)


@pytest.fixture
def recorders(tmp_path: Path) -> Iterator[list[RecorderProcess]]:
    started: list[RecorderProcess] = []
    try:
        for name in ("recorder-1", "recorder-2"):
            started.append(RecorderProcess(tmp_path / name, ui_listen="off").start())
        yield started
    finally:
        shutdown_pipelines()
        for process in started:
            process.stop()


@pytest.fixture
def balancer(tmp_path: Path, recorders: list[RecorderProcess]) -> Iterator[tuple[str, Path]]:
    """nginx on the rendered config, in the foreground; yields its endpoint and its access log."""
    program = nginx_program()
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    port = free_port()
    config = prefix / "nginx.conf"
    config.write_text(render([r.endpoint for r in recorders], port, prefix))
    access_log, error_log = prefix / "access.log", prefix / "error.log"
    command = [program, "-p", str(prefix), "-c", str(config), "-e", "stderr",
               "-g", f"daemon off; pid {prefix / 'nginx.pid'};"]  # fmt: skip
    with access_log.open("w") as out, error_log.open("w") as err:
        nginx = subprocess.Popen(command, stdout=out, stderr=err)
    try:
        deadline = time.monotonic() + 10
        while True:
            assert nginx.poll() is None, f"nginx exited {nginx.returncode}:\n{error_log.read_text()}"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"nginx did not listen:\n{error_log.read_text()}"
                time.sleep(0.05)
        yield f"127.0.0.1:{port}", access_log
    finally:
        nginx.terminate()
        nginx.wait(10)


def test_shipped_config_is_valid_for_this_nginx(tmp_path: Path) -> None:
    """`nginx -t` on the rendered config, which also prints the version that was tested."""
    prefix = tmp_path / "nginx"
    prefix.mkdir()
    config = prefix / "nginx.conf"
    config.write_text(render(["127.0.0.1:1", "127.0.0.1:2"], free_port(), prefix))
    result = subprocess.run([nginx_program(), "-t", "-p", str(prefix), "-c", str(config), "-e", "stderr",
                             "-g", f"pid {prefix / 'nginx.pid'};"], capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0 and "syntax is ok" in result.stderr, result.stderr


def serving(endpoint: str) -> bool:
    with grpc.insecure_channel(endpoint) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_one_connection_stays_on_one_recorder_and_connections_spread_over_both(
    balancer: tuple[str, Path], recorders: list[RecorderProcess]
) -> None:
    endpoint, access_log = balancer
    run_ids = set()
    for number in range(RUNS):  # separate agents, one pipeline (one channel to nginx), as in one agent process
        agent = echo_agent(endpoint, calls=2)
        run_ids.add((await agent.run(f"go {number}", conversation_id=f"lb-{number}")).run_id)
    shutdown_pipelines()

    # Every record of the agent process's connection went to one recorder: its runs are whole there.
    shares = []
    for recorder in recorders:
        async with RecorderClient(recorder.endpoint) as direct:
            shares.append({run.run_id for run in await direct.list_runs()})
    assert sorted(map(len, shares)) == [0, RUNS] and set().union(*shares) == run_ids, shares

    # New connections (a health check each) are spread over both recorders by the hash.
    for _ in range(CONNECTIONS):
        assert await asyncio.to_thread(serving, endpoint)
    async with RecorderClient(endpoint) as through_balancer:
        assert {run.run_id for run in await through_balancer.list_runs()} <= run_ids
        assert (await through_balancer.sql("SELECT count(*) AS n FROM events")).num_rows == 1

    lines = access_log.read_text().splitlines()
    by_method: dict[str, set[str]] = {}
    for line in lines:
        if match := re.search(r'"POST /(\S+) HTTP/2.0" 200 upstream=(\S+) grpc_status=0 ', line):
            by_method.setdefault(match[1].rsplit("/", 1)[1], set()).add(match[2])
    both = {recorder.endpoint for recorder in recorders}
    assert len(by_method["Export"]) == 1, lines
    assert by_method["Check"] == both, lines


async def test_a_stopped_recorder_is_passed_over_and_its_share_goes_to_the_other(
    balancer: tuple[str, Path], recorders: list[RecorderProcess]
) -> None:
    """nginx's passive health: an RPC refused by the stopped recorder goes to the next one (it was never
    sent), and after max_fails refusals nginx stops trying the stopped one for fail_timeout.

    The agent process keeps one connection, which the hash sends to either recorder; the health checks'
    new connections make sure some are hashed to the stopped one (all on the live one once in 2**16)."""
    endpoint, access_log = balancer
    alive, stopped = recorders
    assert stopped.stop() == 0
    run_ids = set()
    for number in range(3):
        agent = echo_agent(endpoint, calls=2)
        run_ids.add((await agent.run(f"go {number}", conversation_id=f"failover-{number}")).run_id)
    shutdown_pipelines()
    for _ in range(CONNECTIONS):
        assert await asyncio.to_thread(serving, endpoint)

    async with RecorderClient(alive.endpoint) as direct:
        assert {run.run_id for run in await direct.list_runs()} == run_ids  # whole runs: it got every record
    async with RecorderClient(endpoint) as through_balancer:
        assert {run.run_id for run in await through_balancer.list_runs()} == run_ids
    lines = access_log.read_text().splitlines()
    exports = [line for line in lines if "LogsService/Export" in line]
    assert exports and all(f"upstream={alive.endpoint} " in line or f", {alive.endpoint} " in line
                           for line in exports), lines  # fmt: skip
    assert all("grpc_status=0 " in line for line in exports), lines
    retried = [line for line in lines if f"upstream={stopped.endpoint}, {alive.endpoint} " in line]
    assert 1 <= len(retried) <= 3, lines  # max_fails=3: then the stopped one is skipped


def test_compose_lake_profile_runs_this_config_before_its_recorders() -> None:
    """The names the config balances to are the lake profile's recorders, which run in lake mode."""
    compose = (ROOT / "docker" / "compose.yaml").read_text()
    lines = [line.split("#")[0].rstrip() for line in compose.splitlines()]
    upstreams = re.findall(r"^\s*server\s+([\w-]+):4317\b", CONFIG.read_text(), flags=re.MULTILINE)
    assert upstreams == ["recorder-1", "recorder-2"]
    for name in (*upstreams, "balancer", "postgres", "s3", "s3-bucket"):
        assert f"  {name}:" in lines, f"compose.yaml has no service {name}"
    assert "      - ./nginx-grpc.conf:/etc/nginx/nginx.conf:ro" in lines
    assert lines.count("    <<: *steprec-lake-recorder") == 2
    for flag in ("--lake", "--lake-data", "--s3-endpoint-url"):
        assert f'"{flag}"' in compose
    # Every lake service says so (the recorders through their anchor); `recorder` stays without a profile.
    assert lines.count("    profiles: [lake]") == 4 and "  profiles: [lake]" in lines
