"""Ordered, batched delivery of steprec records on one background thread, with a disk spool.

The processor owns batching, the thread and the spool so the exporter stays a
plain request/response object (the OpenTelemetry SDK's split). Unlike the SDK's
`BatchLogRecordProcessor`, it keeps emit order across batches and lets a hook
wait on a *barrier*: "every record emitted so far has been answered". That is
how a snapshot or a tool-effect `started` record is acknowledged by the
recorder before the hook returns, while step events travel in batches.

When the recorder cannot take a request it goes to the spool, and so does every
later request until the spool has drained, so order survives an outage. A
barrier is then answered by the spool write: the agent keeps running, and the
drain loop re-sends in the background.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future

from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk._logs import LogRecordProcessor, ReadWriteLogRecord

from ._acknowledged_export import AcknowledgedLogExporter, Refusal
from ._spool import Spool

logger = logging.getLogger(__name__)

_KEPT_REFUSALS = 1024
"""Refusals kept for `pop_refusal`; only refused records land here, so this is rarely reached."""
_MAX_BATCH_BYTES = 2 << 20
"""Requests stay well under gRPC's default 4 MiB message cap."""
_DRAIN_BACKOFF = (0.05, 5.0)


class Delivery(enum.Enum):
    """How the records up to a barrier were answered."""

    ACKNOWLEDGED = "acknowledged"
    """The recorder committed them (to its write-ahead log)."""
    SPOOLED = "spooled"
    """The recorder was unreachable; they are in the local spool and will be re-sent."""
    DROPPED = "dropped"
    """Unreachable and the spool was full: lost, counted and logged."""


class OrderedDeliveryProcessor(LogRecordProcessor):
    """Sends records in emit order, in batches, and answers barriers once their records are answered."""

    def __init__(
        self,
        exporter: AcknowledgedLogExporter,
        spool: Spool,
        *,
        max_batch: int = 512,
        linger_seconds: float = 0.05,
    ) -> None:
        self._exporter = exporter
        self._spool = spool
        self._max_batch = max_batch
        self._linger = linger_seconds
        self._cond = threading.Condition()
        self._pending: deque[ReadWriteLogRecord] = deque()
        self._emitted = 0
        self._answered = 0
        self._waiters: list[tuple[int, Future[Delivery]]] = []
        self._refusals: OrderedDict[int, Refusal] = OrderedDict()
        self._last_delivery = Delivery.ACKNOWLEDGED
        self._drain_after = 0.0
        self._drain_backoff = _DRAIN_BACKOFF[0]
        self._drain_failures = 0
        self._closed = False
        self._thread = threading.Thread(target=self._deliver_forever, name="steprec-delivery", daemon=True)
        self._thread.start()

    @property
    def dropped_requests(self) -> int:
        return self._spool.dropped

    def on_emit(self, log_record: ReadWriteLogRecord) -> None:
        with self._cond:
            if self._closed:
                logger.warning(
                    "steprec: record emitted after shutdown was dropped: %s", log_record.log_record.event_name
                )
                return
            self._pending.append(log_record)
            self._emitted += 1
            if len(self._pending) >= self._max_batch:
                self._cond.notify()

    def barrier(self) -> Future[Delivery]:
        """A future that resolves once every record emitted so far was answered.

        Its value says how the newest of them was answered (the batch that
        answers a barrier always holds the record emitted last before it);
        refusals of single records are read with `pop_refusal`.
        """
        future: Future[Delivery] = Future()
        with self._cond:
            if self._answered >= self._emitted:
                future.set_result(self._last_delivery)
            else:
                self._waiters.append((self._emitted, future))
                self._cond.notify()
        return future

    def pop_refusal(self, record: object) -> Refusal | None:
        """The recorder's refusal of `record` (the LogRecord passed to `Logger.emit`), if it refused it."""
        with self._cond:
            return self._refusals.pop(id(record), None)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Answer everything emitted, then try once more to drain the spool; True if nothing is left over.

        Records still spooled afterwards are safe on disk: a recorder that is
        down is not waited for, a later process re-sends them.
        """
        deadline = time.monotonic() + timeout_millis / 1000
        try:
            self.barrier().result(timeout=timeout_millis / 1000)
        except TimeoutError:
            return False
        with self._cond:
            failures = self._drain_failures
            self._drain_after = 0.0
            self._cond.notify()
            while self._spool and self._drain_failures == failures and time.monotonic() < deadline:
                self._cond.wait(min(0.05, max(deadline - time.monotonic(), 0)))
            return not self._spool

    def shutdown(self) -> None:
        self.force_flush(10_000)
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
        self._exporter.shutdown()
        self._spool.close()

    # -- the delivery thread -------------------------------------------------------------------

    def _next_batch(self) -> list[ReadWriteLogRecord] | None:
        """Wait for a batch worth sending (a barrier waits, the batch is full, it lingered) or a drain turn.

        Returns an empty list when only the spool needs attention, None at shutdown.
        """
        with self._cond:
            deadline: float | None = None
            while True:
                now = time.monotonic()
                if self._pending and (self._waiters or len(self._pending) >= self._max_batch or self._closed):
                    break
                if self._spool and now >= self._drain_after and not self._closed:
                    return []
                if self._pending:
                    deadline = deadline or now + self._linger
                    if now >= deadline:
                        break
                    self._cond.wait(deadline - now)
                elif self._closed:
                    return None
                else:
                    self._cond.wait(max(self._drain_after - now, 0.01) if self._spool else None)
            batch, size = [], 0
            while self._pending and len(batch) < self._max_batch:
                body = self._pending[0].log_record.body
                size += _rough_size(body)
                if batch and size > _MAX_BATCH_BYTES:
                    break
                batch.append(self._pending.popleft())
            return batch

    def _deliver_forever(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                if batch:
                    self._deliver(batch)
                self._drain_spool()
            except Exception:  # the delivery thread must survive anything
                logger.exception("steprec: delivery failed unexpectedly")

    def _deliver(self, batch: list[ReadWriteLogRecord]) -> None:
        request = encode_logs(batch)
        if not self._spool:
            outcome = self._exporter.send(request)
            if outcome.delivered:
                self._settle(batch, Delivery.ACKNOWLEDGED, outcome.refusals)
                return
            logger.warning(
                "steprec: the recorder did not take the request (unreachable or refusing); spooling records to %s",
                self._spool.directory,
            )
        spooled = self._spool.append(request.SerializeToString())
        self._settle(batch, Delivery.SPOOLED if spooled else Delivery.DROPPED, ())

    def _drain_spool(self) -> None:
        """Re-send spooled requests in order, many per Export, until one fails (then back off).

        It stops early for a hook waiting on a barrier: that hook's records go to the spool behind
        these (order is kept) and its barrier is answered, so catching up after an outage holds an
        agent up by one Export at most, not by the whole spool.
        """
        while (head := self._spool.peek(_MAX_BATCH_BYTES)) is not None:
            if time.monotonic() < self._drain_after:
                return
            end, payloads = head
            # Serialised requests concatenate into one request holding all their records, in order.
            outcome = self._exporter.send(ExportLogsServiceRequest.FromString(b"".join(payloads)))
            if not outcome.delivered:
                self._drain_after = time.monotonic() + self._drain_backoff
                self._drain_backoff = min(self._drain_backoff * 2, _DRAIN_BACKOFF[1])
                with self._cond:
                    self._drain_failures += 1
                    self._cond.notify_all()
                return
            for refusal in outcome.refusals:
                logger.warning("steprec: recorder refused a spooled record: %s", refusal.reason)
            self._spool.acknowledge(end)
            self._drain_backoff = _DRAIN_BACKOFF[0]
            with self._cond:
                self._cond.notify_all()
                if self._waiters:
                    return
        logger.debug("steprec: spool drained")

    def _settle(self, batch: list[ReadWriteLogRecord], delivery: Delivery, refusals: tuple[Refusal, ...]) -> None:
        with self._cond:
            for refusal in refusals:
                if 0 <= refusal.index < len(batch):
                    record = batch[refusal.index].log_record
                    logger.warning("steprec: recorder refused %s: %s", record.event_name, refusal.reason)
                    self._refusals[id(record)] = refusal
                    while len(self._refusals) > _KEPT_REFUSALS:
                        self._refusals.popitem(last=False)
            self._answered += len(batch)
            self._last_delivery = delivery
            still_waiting = []
            for target, future in self._waiters:
                if target <= self._answered:
                    future.set_result(delivery)
                else:
                    still_waiting.append((target, future))
            self._waiters = still_waiting
            self._cond.notify_all()


def _rough_size(body: object) -> int:
    """Bytes a record's body adds to a request, near enough to keep requests under the cap."""
    if isinstance(body, dict):
        return 64 + sum(_rough_size(v) for v in body.values())
    if isinstance(body, (list, tuple)):
        return sum(_rough_size(v) for v in body)
    if isinstance(body, (str, bytes)):
        return len(body) + 8
    return 16
