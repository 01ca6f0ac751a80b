"""A recorder in its own OS process, on a free loopback port: for the demo, tests and benchmarks."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import allocators

_METRICS = re.compile(r"metrics on (http://\S+)")
_BROWSER = re.compile(r"browser on (https?://\S+)")
_LISTENING = re.compile(r"listening on (?:(https?)://)?(\S+):(\d+)")


class RecorderProcess:
    """`steprec serve` as a child process; `endpoint` is valid once `start()` returned."""

    def __init__(
        self,
        data_dir: Path,
        *,
        listen: str = "127.0.0.1:0",
        ui_listen: str = "127.0.0.1:0",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        """`ui_listen` is where the run browser goes (`off` for none): a free port by default, so recorders
        started side by side never contend for the default one."""
        self.data_dir = data_dir
        self.listen = listen
        self.ui_listen = ui_listen
        self.extra_args = extra_args
        self.ui_url = ""
        self.process: subprocess.Popen[str] | None = None
        self.endpoint = ""
        self.metrics_url = ""
        self.log_path = data_dir / "recorder.log"

    def start(self, timeout: float = 30.0) -> RecorderProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "steprec.recorder",
            "serve",
            "--listen",
            self.listen,
            "--data",
            str(self.data_dir),
            "--ui-listen",
            self.ui_listen,
        ]
        # Owner-only, like everything in the data folder; the child owns the handle for its lifetime.
        log = os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a")
        self.process = subprocess.Popen(
            [*command, *self.extra_args],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env={**os.environ, **allocators.missing()},  # as `steprec serve` would restart itself with them
        )
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            if match := _METRICS.search(line):
                self.metrics_url = match[1]
            if match := _BROWSER.search(line):
                self.ui_url = match[1]
            if match := _LISTENING.search(line):
                scheme = "https://" if match[1] == "https" else ""
                self.endpoint = f"{scheme}{match[2]}:{match[3]}"
                return self
        self.kill()
        raise RuntimeError(f"the recorder did not start; see {self.log_path}:\n{self.log_path.read_text()[-2000:]}")

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait for the drain; returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> RecorderProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        except subprocess.TimeoutExpired:
            self.kill()
