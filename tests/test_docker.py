"""Checks of docker/Dockerfile and docker/compose.yaml that need no Docker engine.

No engine runs on the development machines or in CI, so the image is never built
here. What can still break silently is checked instead: paths the build copies,
the pinning and hardening the Dockerfile promises, the compose wiring, and that
the image's exact entry command and health check work against a real daemon.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
COMPOSE = DOCKER / "compose.yaml"
STEPREC = Path(sys.executable).parent / "steprec"


def instructions() -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per Dockerfile instruction, comments dropped, `\\` continuations joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (keyword.upper(), rest.strip())
        for keyword, _, rest in (line.partition(" ") for line in lines if line and not line.startswith("#"))
    ]


def values(keyword: str) -> list[str]:
    return [rest for key, rest in instructions() if key == keyword]


def entry_command() -> list[str]:
    """The container's command: ENTRYPOINT followed by CMD, both in exec (JSON) form."""
    command: list[str] = []
    for keyword in ("ENTRYPOINT", "CMD"):
        found = values(keyword)
        if found:
            command += json.loads(found[-1])
    return command


def test_dockerfile_copies_only_paths_that_exist():
    """A renamed folder would otherwise surface only when someone finally runs docker build."""
    sources = []
    for arguments in values("COPY"):
        if arguments.startswith("--from="):
            continue  # copies between stages, not from the build context
        sources += shlex.split(arguments)[:-1]
    assert sources, "the Dockerfile copies nothing from the build context"
    for source in sources:
        assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
    # The daemon's three distributions, and not the exporter it does not need.
    assert {"proto/", "query/", "recorder/", "constraints.txt"} <= set(sources)
    assert not any(source.startswith("exporter") for source in sources)


def test_dockerfile_is_pinned_and_hardened():
    """Reproducible (pinned base, constraints) and least-privilege (non-root, data only in /data)."""
    bases = {arguments.split()[0] for arguments in values("FROM")}
    assert bases, "no FROM"
    for base in bases:
        tag = base.partition("@")[0].partition(":")[2]
        assert tag and tag != "latest" and re.match(r"\d+\.\d+\.\d+", tag), f"base image {base} is not pinned"
    assert len(bases) == 1, "the venv copied between stages needs the same Python in both"
    assert any("-c constraints.txt" in run for run in values("RUN"))
    user = values("USER")[-1].split(":")[0]
    assert user not in ("root", "0"), "the daemon must not run as root"
    assert user in ("10001", "steprec")
    assert "4317" in values("EXPOSE")[-1].split()
    assert values("VOLUME")[-1].split() == ["/data", "/journal"]
    assert values("HEALTHCHECK") and "healthcheck.py" in values("HEALTHCHECK")[-1]
    assert entry_command() == ["steprec", "serve", "--listen", "0.0.0.0:4317", "--data", "/data"]


def test_compose_wires_the_recorder_service():
    """compose.yaml is plain YAML (PyYAML is no dependency), so check the lines that matter."""
    text = COMPOSE.read_text()
    lines = [line.split("#")[0].rstrip() for line in text.splitlines()]
    assert "services:" in lines and "  recorder:" in lines
    assert "volumes:" in lines and "  steprec-data:" in lines and "  steprec-journal:" in lines  # named volumes
    assert any(line.strip() == "- steprec-data:/data" for line in lines)
    # The recorder adopts the journals of agents that share its journal volume, as its user.
    assert [line.strip() for line in lines].count("- steprec-journal:/journal") == 2
    assert any(line.strip() == "STEPREC_ADOPT_JOURNALS: /journal" for line in lines)
    assert any(line.strip() == "STEPREC_JOURNAL_DIR: /journal" for line in lines)
    assert any(line.strip() == 'user: "10001:10001"' for line in lines)
    assert "x-steprec-agent: &steprec-agent" in lines
    assert any(line.strip() == '- "127.0.0.1:4317:4317"' for line in lines), "publish on loopback only"
    assert any(line.strip() == "restart: unless-stopped" for line in lines)
    context = next(line.split(":", 1)[1].strip() for line in lines if line.strip().startswith("context:"))
    dockerfile = next(line.split(":", 1)[1].strip() for line in lines if line.strip().startswith("dockerfile:"))
    assert (DOCKER / context).resolve() == ROOT
    assert (DOCKER / context / dockerfile).resolve() == DOCKERFILE
    assert "\t" not in text, "YAML forbids tabs for indentation"


def test_entry_command_serves_and_passes_healthcheck(tmp_path: Path):
    """Run the image's own CMD (loopback, free port, tmp data) and the image's own health check."""
    assert STEPREC.exists(), f"{STEPREC} missing: install the workspace first"
    # Same arguments, but on loopback (a free port) with data under tmp_path, using this venv's steprec.
    local = {"steprec": str(STEPREC), "0.0.0.0:4317": "127.0.0.1:0", "/data": str(tmp_path)}
    command = [local.get(part, part) for part in entry_command()]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        listening: list[str] = []
        seen = threading.Event()

        def read() -> None:  # a thread, so a silent server cannot block the test past its timeout
            for line in server.stdout:
                if "listening on" in line:
                    listening.append(line)
                    seen.set()

        threading.Thread(target=read, daemon=True).start()
        assert seen.wait(30), f"no 'listening on' line within 30 s (exit code {server.poll()})"
        port = re.search(r":(\d+) ", listening[0]).group(1)

        health = subprocess.run(
            [sys.executable, str(DOCKER / "healthcheck.py"), port], capture_output=True, text=True, timeout=30
        )
        assert health.returncode == 0, health.stderr

        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0
        assert (tmp_path / "steprec.duckdb").exists()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def test_healthcheck_fails_clearly_when_nothing_listens():
    """The check must not pass on a dead daemon: non-zero exit and a reason on stderr."""
    with socket.socket() as probe:  # a port that was free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    health = subprocess.run(
        [sys.executable, str(DOCKER / "healthcheck.py")],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "STEPREC_HEALTH_PORT": str(port)},
    )
    assert health.returncode == 1
    assert "unreachable" in health.stderr
