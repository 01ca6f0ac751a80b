"""Ordered, batched delivery of steprec records on one background thread.

The processor owns batching and the thread so the exporter stays a plain
request/response object (the OpenTelemetry SDK's split). Unlike the SDK's
`BatchLogRecordProcessor`, it keeps emit order across batches and lets a hook
wait on a *barrier*: "every record emitted so far has been answered". That is
how a snapshot or a tool-effect `started` record becomes durable before the
hook returns while step events still travel in batches.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future

from opentelemetry.sdk._logs import LogRecordProcessor, ReadWriteLogRecord

from ._acknowledged_export import AcknowledgedLogExporter, Refusal

logger = logging.getLogger(__name__)

_KEPT_REFUSALS = 1024
"""Refusals kept for `pop_refusal`; only refused records land here, so this is rarely reached."""


class OrderedDeliveryProcessor(LogRecordProcessor):
    """Sends records in emit order, in batches, and answers barriers once their records are acknowledged."""

    def __init__(
        self,
        exporter: AcknowledgedLogExporter,
        *,
        max_batch: int = 512,
        linger_seconds: float = 0.05,
    ) -> None:
        self._exporter = exporter
        self._max_batch = max_batch
        self._linger = linger_seconds
        self._cond = threading.Condition()
        self._pending: deque[ReadWriteLogRecord] = deque()
        self._emitted = 0
        self._answered = 0
        self._waiters: list[tuple[int, Future[bool]]] = []
        self._refusals: OrderedDict[int, Refusal] = OrderedDict()
        self._last_batch_delivered = True
        self._closed = False
        self._thread = threading.Thread(target=self._deliver_forever, name="steprec-delivery", daemon=True)
        self._thread.start()

    def on_emit(self, log_record: ReadWriteLogRecord) -> None:
        with self._cond:
            if self._closed:
                logger.warning("steprec: record emitted after shutdown was dropped: %s", log_record.log_record.event_name)
                return
            self._pending.append(log_record)
            self._emitted += 1
            if len(self._pending) >= self._max_batch:
                self._cond.notify()

    def barrier(self) -> Future[bool]:
        """A future that resolves once every record emitted so far was answered.

        Its value says whether the newest of them reached the recorder (the
        batch that answers a barrier always holds the record emitted last before
        it); refusals of single records are read with `pop_refusal`.
        """
        future: Future[bool] = Future()
        with self._cond:
            if self._answered >= self._emitted:
                future.set_result(self._last_batch_delivered)
            else:
                self._waiters.append((self._emitted, future))
                self._cond.notify()
        return future

    def pop_refusal(self, record: object) -> Refusal | None:
        """The recorder's refusal of `record` (the LogRecord passed to `Logger.emit`), if it refused it."""
        with self._cond:
            return self._refusals.pop(id(record), None)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        try:
            return self.barrier().result(timeout=timeout_millis / 1000)
        except TimeoutError:
            return False

    def shutdown(self) -> None:
        self.force_flush()
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
        self._exporter.shutdown()

    def _next_batch(self) -> list[ReadWriteLogRecord] | None:
        """Wait for a batch worth sending: a barrier waits, the batch is full, or it lingered long enough."""
        with self._cond:
            deadline: float | None = None
            while True:
                if self._pending and (self._waiters or len(self._pending) >= self._max_batch or self._closed):
                    break
                if self._pending:
                    now = time.monotonic()
                    deadline = deadline or now + self._linger
                    if now >= deadline:
                        break
                    self._cond.wait(deadline - now)
                elif self._closed:
                    return None
                else:
                    deadline = None
                    self._cond.wait()
            count = min(len(self._pending), self._max_batch)
            return [self._pending.popleft() for _ in range(count)]

    def _deliver_forever(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                outcome = self._exporter.export_acknowledged(batch)
            except Exception:  # the exporter must never kill the delivery thread
                logger.exception("steprec: exporting %d records raised", len(batch))
                outcome = None
            delivered = outcome is not None and outcome.delivered
            if not delivered:
                logger.warning("steprec: %d records could not be delivered to the recorder", len(batch))
            self._settle(batch, delivered, outcome.refusals if outcome else ())

    def _settle(self, batch: list[ReadWriteLogRecord], delivered: bool, refusals: tuple[Refusal, ...]) -> None:
        with self._cond:
            for refusal in refusals:
                if 0 <= refusal.index < len(batch):
                    record = batch[refusal.index].log_record
                    logger.warning("steprec: recorder refused %s: %s", record.event_name, refusal.reason)
                    self._refusals[id(record)] = refusal
                    while len(self._refusals) > _KEPT_REFUSALS:
                        self._refusals.popitem(last=False)
            self._answered += len(batch)
            self._last_batch_delivered = delivered
            still_waiting = []
            for target, future in self._waiters:
                if target <= self._answered:
                    future.set_result(delivered)
                else:
                    still_waiting.append((target, future))
            self._waiters = still_waiting
