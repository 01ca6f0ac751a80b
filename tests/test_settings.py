"""`steprec serve` settings: flag over environment over config file over default, bad values refused clearly."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from steprec.recorder.daemon import allocators
from steprec.recorder.daemon.allocators import SETTINGS
from steprec.recorder.daemon.settings import add_arguments, resolve


def _resolve(args: list[str], environ: dict[str, str] | None = None) -> dict:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return resolve(parser.parse_args(args), environ or {})


def test_precedence_is_flag_then_environment_then_config_then_default(tmp_path: Path) -> None:
    config = tmp_path / "steprec.toml"
    config.write_text('listen = "127.0.0.1:5000"\nmax_snapshots_per_run = 7\nfsync = true\n')
    settings = _resolve(["--config", str(config)], {"STEPREC_MAX_SNAPSHOTS_PER_RUN": "3"})
    assert (settings["listen"], settings["max_snapshots_per_run"], settings["fsync"]) == ("127.0.0.1:5000", 3, True)
    settings = _resolve(["--config", str(config), "--listen", "127.0.0.1:6000"], {"STEPREC_LISTEN": "127.0.0.1:7000"})
    assert settings["listen"] == "127.0.0.1:6000"
    assert _resolve([])["listen"] == "127.0.0.1:4317" and _resolve([])["data"] == Path("steprec-data")


def test_journal_folders_to_adopt_come_from_repeated_flags_the_environment_or_a_config_list(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert _resolve(["--adopt-journals", str(a), "--adopt-journals", str(b)])["adopt_journals"] == (a, b)
    assert _resolve([], {"STEPREC_ADOPT_JOURNALS": f"{a}{os.pathsep}{b}"})["adopt_journals"] == (a, b)
    config = tmp_path / "steprec.toml"
    config.write_text(f"adopt_journals = [{str(a)!r}, {str(b)!r}]\n")
    assert _resolve(["--config", str(config)])["adopt_journals"] == (a, b)
    assert _resolve([])["adopt_journals"] == ()


@pytest.mark.parametrize(
    ("args", "environ", "config", "message"),
    [
        (["--listen", "nowhere"], {}, None, "--listen: 'nowhere' is not HOST:PORT"),
        ([], {"STEPREC_MAX_SNAPSHOTS_PER_RUN": "0"}, None, "STEPREC_MAX_SNAPSHOTS_PER_RUN: '0' is not a positive"),
        ([], {"STEPREC_FSYNC": "maybe"}, None, "STEPREC_FSYNC: 'maybe' is not a boolean"),
        ([], {}, "listen = 5\n", "listen: '5' is not HOST:PORT"),
        ([], {}, "lsiten = '127.0.0.1:1'\n", "unknown setting(s) lsiten"),
        ([], {}, "listen = [", "not valid TOML"),
        (["--tls-cert", "/no/such/file"], {}, None, "--tls-cert: '/no/such/file' is not a readable file"),
        (["--adopt-journals", "/etc/hostname"], {}, None, "--adopt-journals: '/etc/hostname' is not a folder"),
        ([], {}, "adopt_journals = 5\n", "adopt_journals: 5 is not a folder or a list of folders"),
    ],
)
def test_bad_settings_name_their_source(tmp_path: Path, args, environ, config, message) -> None:
    if config is not None:
        (tmp_path / "c.toml").write_text(config)
        args = [*args, "--config", str(tmp_path / "c.toml")]
    with pytest.raises(ValueError, match="^.*" + message.replace("(", r"\(").replace(")", r"\)")):
        _resolve(args, environ)


def test_the_command_reports_a_bad_setting_without_a_traceback(tmp_path: Path) -> None:
    steprec = Path(sys.executable).parent / "steprec"
    result = subprocess.run([str(steprec), "serve", "--listen", "nowhere", "--data", str(tmp_path)],
                            capture_output=True, text=True, timeout=30)  # fmt: skip
    assert result.returncode == 2  # a bad setting is a bad argument (cli.EXIT_CODES)
    assert "steprec serve: --listen: 'nowhere' is not HOST:PORT" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads the daemon's environment from /proc")
@pytest.mark.parametrize("operator_value", [None, "5"])
def test_serve_starts_over_with_the_allocator_settings_keeping_the_operators(tmp_path: Path, operator_value) -> None:
    """pyarrow's and DuckDB's allocators read them when they load, before any command runs (allocators.py)."""
    environ = {name: value for name, value in os.environ.items() if name not in SETTINGS}
    if operator_value is not None:
        environ["MIMALLOC_PURGE_DELAY"] = operator_value
    steprec = Path(sys.executable).parent / "steprec"
    daemon = subprocess.Popen([str(steprec), "serve", "--listen", "127.0.0.1:0", "--data", str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environ)  # fmt: skip
    try:
        assert daemon.stdout is not None
        while "listening on" not in (line := daemon.stdout.readline()):
            assert line, "the daemon ended before it listened"
        started = dict(
            item.split("=", 1) for item in Path(f"/proc/{daemon.pid}/environ").read_text().split("\0") if item
        )
    finally:
        daemon.terminate()
        daemon.wait(30)
    expected = {**SETTINGS, **({"MIMALLOC_PURGE_DELAY": operator_value} if operator_value else {})}
    assert {name: started.get(name) for name in SETTINGS} == expected  # same process id: it replaced itself


@pytest.mark.skipif(allocators._glibc_trim() is None, reason="malloc_trim is glibc's")
def test_the_trimming_thread_gives_back_what_glibcs_heaps_hold_free_and_stops() -> None:
    """Strings of 0.5-2 KB live in glibc's heaps; nine in ten freed, interleaved with the kept ones, leave
    free memory the heap's top cannot return (what the soak showed). The thread gives it back."""

    def rss_mib() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)

    kept, freed = [], []
    for i in range(100_000):
        (kept if i % 10 == 0 else freed).append(b"x" * (512 + i % 1536))
    del freed
    before = rss_mib()
    stop = threading.Event()
    thread = allocators.trim_periodically(stop, every=0.05)
    try:
        deadline = time.monotonic() + 10
        while rss_mib() > before - 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rss_mib() < before - 50, (before, rss_mib())  # about 110 MiB were freed
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive() and len(kept) == 10_000
