"""The recorder under load: SIGKILL loses no acknowledged record, SIGTERM drains and exits cleanly."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from steprec.recorder.daemon.process import RecorderProcess
from steprec.recorder.store.duckdb_store import DuckDBStore
from steprec.recorder.store.wal import WriteAheadLog

from benchmarks.load import step_events_request


def _request(sender: int, number: int) -> logs_service_pb2.ExportLogsServiceRequest:
    return step_events_request(f"load-{sender}", number, records=20)


class _Load:
    """Senders that remember which requests the recorder acknowledged."""

    def __init__(self, endpoint: str, senders: int = 3) -> None:
        self.acknowledged: dict[int, list[int]] = {s: [] for s in range(senders)}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(endpoint, s)) for s in range(senders)]

    def _send(self, endpoint: str, sender: int) -> None:
        stub = logs_service_pb2_grpc.LogsServiceStub(grpc.insecure_channel(endpoint))
        number = 0
        while not self._stop.is_set():
            try:
                stub.Export(_request(sender, number), timeout=5)
            except grpc.RpcError:
                return  # the recorder is gone; what was acknowledged is what counts
            self.acknowledged[sender].append(number)
            number += 1

    def __enter__(self) -> _Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


def _stored_requests(data_dir: Path) -> dict[str, list[int]]:
    store = DuckDBStore(data_dir / "steprec.duckdb")
    try:
        rows = (
            store.cursor()
            .execute("SELECT run_id, step_index, count(*) FROM events GROUP BY ALL ORDER BY run_id, step_index")
            .fetchall()
        )
    finally:
        store.close()
    stored: dict[str, list[int]] = {}
    for run_id, step, count in rows:
        assert count == 20, f"request {step} of {run_id} stored {count} of its 20 records"
        stored.setdefault(run_id, []).append(step)
    return stored


def test_sigkill_under_load_loses_no_acknowledged_record(tmp_path: Path) -> None:
    recorder = RecorderProcess(tmp_path).start()
    with _Load(recorder.endpoint) as load:
        time.sleep(1.5)
        recorder.kill()
    assert all(len(numbers) > 10 for numbers in load.acknowledged.values()), "the load never got going"
    stored = _stored_requests(tmp_path)
    for sender, numbers in load.acknowledged.items():
        assert set(numbers) <= set(stored[f"load-{sender}"])


def test_sigterm_drains_commits_and_exits_within_bounds(tmp_path: Path) -> None:
    recorder = RecorderProcess(tmp_path).start()
    with _Load(recorder.endpoint) as load:
        time.sleep(1.0)
        started = time.monotonic()
        assert recorder.stop(timeout=15) == 0
        stopped_in = time.monotonic() - started
    assert stopped_in < 12
    # A clean stop applied everything it acknowledged: nothing is left for the log to replay.
    with duckdb.connect(str(tmp_path / "steprec.duckdb"), read_only=True) as db:
        applied = db.execute("SELECT applied_seq FROM steprec_wal").fetchone()[0]
    assert list(WriteAheadLog(tmp_path / "wal").entries_after(applied)) == []
    stored = _stored_requests(tmp_path)
    for sender, numbers in load.acknowledged.items():
        assert set(numbers) <= set(stored[f"load-{sender}"])
