"""The write-ahead log: torn tails are cut, and a killed recorder's acknowledged requests come back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from steprec.proto.framing import encode_frame, open_for_append, read_frames
from steprec.recorder.store.duckdb_store import DuckDBStore
from steprec.recorder.store.wal import WriteAheadLog


def test_a_torn_last_frame_is_ignored_and_cut_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(encode_frame(1, b"one") + encode_frame(2, b"two") + encode_frame(3, b"three")[:-2])
    assert [(s, p) for s, _, p in read_frames(path)] == [(1, b"one"), (2, b"two")]
    file, last = open_for_append(path)
    file.write(encode_frame(3, b"again"))
    file.close()
    assert [p for _, _, p in read_frames(path)] == [b"one", b"two", b"again"]
    assert last == 2


def test_a_corrupt_frame_stops_reading(tmp_path: Path) -> None:
    path = tmp_path / "log"
    good, bad = encode_frame(1, b"one"), bytearray(encode_frame(2, b"two"))
    bad[-1] ^= 0xFF
    path.write_bytes(good + bytes(bad) + encode_frame(3, b"three"))
    assert [s for s, _, _ in read_frames(path)] == [1]


def test_segments_rotate_and_applied_ones_are_released(tmp_path: Path, monkeypatch) -> None:
    from steprec.recorder.store import wal as wal_module

    monkeypatch.setattr(wal_module, "ROTATE_BYTES", 10)
    log = WriteAheadLog(tmp_path)
    for n in range(3):
        log.append(b"x" * 20)
        log.release(n + 1)
    log.append(b"tail")
    assert [s for s, _ in log.entries_after(0)] == [4]
    assert len(list(tmp_path.glob("wal-*.log"))) == 1
    log.close()
    assert WriteAheadLog(tmp_path).last_sequence == 4


def test_segments_rotate_under_steady_load_when_something_is_always_pending(tmp_path: Path, monkeypatch) -> None:
    # The applier never finds everything applied while requests keep arriving; rotating only then
    # let one segment grow without end (by 0.5 MiB/s, 194 MiB after 400 s of the soak).
    from steprec.recorder.store import wal as wal_module

    monkeypatch.setattr(wal_module, "ROTATE_BYTES", 100)
    log = WriteAheadLog(tmp_path)
    for n in range(1, 200):
        log.append(b"x" * 20)
        log.release(n - 1)  # the newest entry is always still pending
    assert sum(p.stat().st_size for p in tmp_path.glob("wal-*.log")) < 400
    assert [s for s, _ in log.entries_after(198)] == [199]
    log.close()
    assert [s for s, _ in WriteAheadLog(tmp_path).entries_after(198)] == [199]


def test_acknowledged_requests_survive_sigkill_before_they_are_applied(tmp_path: Path) -> None:
    # A child ingests while the applier is held back, then dies without any cleanup.
    child = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
        from steprec.recorder.store import applier, duckdb_store
        applier.APPLY_LINGER_SECONDS = 3600
        applier.APPLY_BATCH_ENTRIES = 10**9
        from tests.test_store import _event
        from pathlib import Path
        store = duckdb_store.DuckDBStore(Path({str(tmp_path / "steprec.duckdb")!r}))
        for i in range(50):
            store.ingest([_event("model_request_started", f"k{{i}}", index=i)])
        print("acknowledged", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert result.returncode == -signal.SIGKILL and "acknowledged" in result.stdout, result.stderr
    store = DuckDBStore(tmp_path / "steprec.duckdb")
    try:
        keys = [e["idempotency_key"] for e in store.list_events("run-1")]
        assert keys == [f"k{i}" for i in range(50)]
        assert os.listdir(tmp_path / "wal")
    finally:
        store.close()
