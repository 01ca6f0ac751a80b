"""Ordered delivery of steprec records through the journal, on one background thread.

The processor owns batching, the thread and the journal so the exporter stays a
plain request/response object (the OpenTelemetry SDK's split). Records wait in
memory in emit order until something journals them: a hook that needs them
durable (`journal`), a full batch, a short linger, or a barrier. Each journal
frame is one encoded OTLP request; the delivery thread sends the journal's
frames in order, many per Export, and the recorder's acknowledgement trims it.
Frames nobody waits for linger too, so an agent journaling three times a step
sends one Export per linger, not three per step: each Export costs the agent's
process and the recorder CPU, and on a small machine they share it.

A barrier ("every record emitted so far has been answered") is what the
`acknowledged` mode and the run's registration and end wait on. When the
recorder is unreachable, a barrier is answered once its records are in the
journal: the agent keeps running, and the thread re-sends with backoff.
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from steprec.proto import wire

from ._acknowledged_export import AcknowledgedLogExporter, Refusal
from ._journal import Journal
from ._otlp import RequestEnvelope
from ._records import Record

logger = logging.getLogger(__name__)

_MAX_BATCH_BYTES = 2 << 20
"""Requests stay well under gRPC's default 4 MiB message cap."""
_RETRY_BACKOFF = (0.05, 5.0)


class Delivery(enum.Enum):
    """How the records up to a point were answered."""

    ACKNOWLEDGED = "acknowledged"
    """The recorder committed them (to its write-ahead log)."""
    JOURNALED = "journaled"
    """They are in this process's journal on disk; the recorder gets them when it can."""
    DROPPED = "dropped"
    """The journal was full or its disk refused them: lost, counted and logged."""


@dataclass
class _Frame:
    """One of this process's journal frames not yet acknowledged: where it ends, its records, and the
    emit count it brings the journal to.

    The records are held weakly: their bytes are in the journal, and a backlog of frames while the
    recorder is unreachable must grow the disk, not this process's memory. A refusal can only
    matter to a caller that still holds the record it waits on.
    """

    end: int
    records: list[weakref.ref[Record]]
    names: list[str]
    through: int


class OrderedDeliveryProcessor:
    """Journals records in emit order, sends the journal in order, answers barriers once their records are."""

    def __init__(
        self,
        exporter: AcknowledgedLogExporter,
        journal: Journal,
        envelope: RequestEnvelope,
        *,
        max_batch: int = 512,
        linger_seconds: float = 0.05,
    ) -> None:
        self._exporter = exporter
        self._journal = journal
        self._envelope = envelope
        self._max_batch = max_batch
        self._linger = linger_seconds
        self._lock = threading.Lock()
        """Not reentrant: nothing under it takes it again. The hooks' own paths (`emit`, `journal`) take it directly,
        without `Condition`'s Python-level wrapper."""
        self._cond = threading.Condition(self._lock)
        self._pending: list[Record] = []
        self._pending_bytes = 0
        self._pending_since = 0.0
        self._emitted = 0
        self._journaled = 0
        self._answered = 0
        self._frames: deque[_Frame] = deque()
        self._wakes_at = 0.0
        """When the delivery thread looks at the queue next (0: it is awake). Hooks wake it only if it
        would sleep past when their records are due: a wake per hook cost the agent a thread switch."""
        self._unsent_since: float | None = None
        """When the oldest record of the journal's unsent frames was emitted; None: send at once (adopted
        segments, a flush, frames left over from the last send)."""
        self._waiters: list[tuple[int, Future[Delivery]]] = []
        self._refusals: weakref.WeakKeyDictionary[Record, Refusal] = weakref.WeakKeyDictionary()
        self._refused_snapshots = 0
        self._last_delivery = Delivery.ACKNOWLEDGED
        self._retry_after = 0.0
        self._backoff = _RETRY_BACKOFF[0]
        self._failures = 0
        self._closed = False
        self._thread = threading.Thread(target=self._deliver_forever, name="steprec-delivery", daemon=True)
        self._thread.start()

    @property
    def dropped_requests(self) -> int:
        return self._journal.dropped

    @property
    def snapshot_resets(self) -> int:
        """Requests dropped plus snapshots refused, so far. When it moves, a run's last snapshot may not
        be stored, so its next one must not be a delta on it (the capability sends that one whole)."""
        return self._journal.dropped + self._refused_snapshots

    @property
    def journal_directory(self) -> Path:
        return self._journal.directory

    def emit(self, record: Record) -> None:
        with self._lock:
            if self._closed:
                logger.warning("steprec: record emitted after shutdown was dropped: %s", record.event_name)
                return
            if not self._pending:
                self._pending_since = time.monotonic()
                self._wake_by(self._pending_since + self._linger)
            self._pending.append(record)
            self._pending_bytes += len(record.data)
            self._emitted += 1
            if len(self._pending) >= self._max_batch or self._pending_bytes >= _MAX_BATCH_BYTES:
                self._journal_pending()
                self._wake_by(self._send_after())

    def journal(self) -> Delivery:
        """Put every record emitted so far into the journal (one `write()`) and return: the records are
        then as durable as the disk, whatever happens to this process."""
        with self._lock:
            delivery = self._journal_pending()
            self._wake_by(self._send_after())
            return delivery

    def barrier(self) -> Future[Delivery]:
        """A future that resolves once every record emitted so far was answered (acknowledged, or
        journaled while the recorder is unreachable). Refusals of single records: `pop_refusal`."""
        future: Future[Delivery] = Future()
        with self._cond:
            if self._answered >= self._emitted:
                future.set_result(self._last_delivery)
            else:
                self._waiters.append((self._emitted, future))
                self._journal_pending()
                self._cond.notify()
        return future

    def pop_refusal(self, record: Record) -> Refusal | None:
        """The recorder's refusal of `record`, if it refused it."""
        with self._cond:
            return self._refusals.pop(record, None)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Answer everything emitted, then try once more to send the journal; True if nothing is left over.

        Frames still journaled afterwards are safe on disk: a recorder that is down is not waited
        for; it, a later process or `steprec journal push` delivers them.
        """
        deadline = time.monotonic() + timeout_millis / 1000
        try:
            self.barrier().result(timeout=timeout_millis / 1000)
        except TimeoutError:
            return False
        with self._cond:
            failures = self._failures
            self._retry_after = 0.0
            self._unsent_since = None
            self._cond.notify()
            while self._journal and self._failures == failures and time.monotonic() < deadline:
                self._cond.wait(min(0.05, max(deadline - time.monotonic(), 0)))
            return not self._journal

    def shutdown(self) -> None:
        self.force_flush(10_000)
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)
        self._exporter.shutdown()
        self._journal.close()

    # -- under the lock ------------------------------------------------------------------------

    def _wake_by(self, due: float) -> None:
        if due < self._wakes_at:
            self._cond.notify()

    def _journal_pending(self) -> Delivery:
        """Journal the pending records as one request; how the newest record emitted stands now."""
        if not self._pending:
            return Delivery.JOURNALED if self._journaled > self._answered else self._last_delivery
        records, self._pending, self._pending_bytes = self._pending, [], 0
        through = self._journaled + len(records)
        self._journaled = through
        end = self._journal.append(self._envelope.request([record.data for record in records]))
        if end is not None:
            if self._unsent_since is None:
                self._unsent_since = self._pending_since
            refs, names = [weakref.ref(record) for record in records], [record.event_name for record in records]
            self._frames.append(_Frame(end, refs, names, through))
            if self._failures and time.monotonic() < self._retry_after:
                self._settle(through, Delivery.JOURNALED)  # unreachable: nobody waits for it
            return Delivery.JOURNALED
        self._settle(through, Delivery.DROPPED)
        return Delivery.DROPPED

    def _settle(self, through: int, delivery: Delivery) -> None:
        if through <= self._answered:
            return
        self._answered = through
        self._last_delivery = delivery
        still_waiting = []
        for target, future in self._waiters:
            if target <= through:
                future.set_result(delivery)
            else:
                still_waiting.append((target, future))
        self._waiters = still_waiting
        self._cond.notify_all()

    def _keep_refusals(self, frames: list[_Frame], refusals: tuple[Refusal, ...]) -> None:
        records = [ref for frame in frames for ref in frame.records]
        names = [name for frame in frames for name in frame.names]
        for refusal in refusals:
            known = 0 <= refusal.index < len(records)
            if known and names[refusal.index] == wire.SNAPSHOT:
                self._refused_snapshots += 1
            record = records[refusal.index]() if known else None
            if record is None:  # adopted from another process, or nobody holds it any more
                logger.warning("steprec: recorder refused a journaled record: %s", refusal.reason)
                continue
            logger.warning("steprec: recorder refused %s: %s", record.event_name, refusal.reason)
            self._refusals[record] = refusal

    # -- the delivery thread -------------------------------------------------------------------

    def _send_after(self) -> float:
        """When the journal's frames are due to be sent: at once if someone waits for them, at shutdown,
        when they fill an Export, or when their time is unknown; else once the oldest has lingered."""
        if (
            self._waiters
            or self._closed
            or self._unsent_since is None
            or self._journal.pending_bytes() >= _MAX_BATCH_BYTES
        ):
            return self._retry_after
        return max(self._retry_after, self._unsent_since + self._linger)

    def _wait_for_work(self) -> bool:
        """Sleep until the journal has frames due (journaling lingering records first); False at shutdown."""
        with self._cond:
            while True:
                now = time.monotonic()
                if self._pending and (self._waiters or self._closed or now - self._pending_since >= self._linger):
                    self._journal_pending()
                if self._closed:
                    # Send what is left until the recorder fails once: then the journal keeps it for the
                    # next process or the recorder to adopt, and nothing retries into a closed journal.
                    return bool(self._journal) and not self._failures
                timeouts = []
                if self._journal:
                    if now >= (send_at := self._send_after()):
                        self._unsent_since = None  # frames journaled from now on linger afresh
                        return True
                    timeouts.append(send_at - now)
                if self._pending:
                    timeouts.append(self._pending_since + self._linger - now)
                timeout = max(min(timeouts), 0.001) if timeouts else None
                self._wakes_at = now + timeout if timeout is not None else math.inf
                self._cond.wait(timeout)
                self._wakes_at = 0.0

    def _deliver_forever(self) -> None:
        while self._wait_for_work():
            try:
                self._send_journal()
            except Exception:  # the delivery thread must survive anything
                logger.exception("steprec: delivery failed unexpectedly")
                time.sleep(0.05)

    def _send_journal(self) -> None:
        """Send the journaled requests that are due in order, up to 2 MiB per Export, until none is left, one
        fails, or what is left was journaled during the sends (it lingers like any other: an agent
        journaling faster than one Export takes would otherwise keep this loop sending one frame each)."""
        while True:
            with self._cond:
                head = self._journal.peek(_MAX_BATCH_BYTES)
                if head is None:
                    return
            end, payloads, own = head
            # Serialised requests concatenate into one request holding all their records, in order.
            outcome = self._exporter.send(b"".join(payloads))
            with self._cond:
                if not outcome.delivered:
                    if not self._failures:
                        logger.warning(
                            "steprec: the recorder did not take the request (unreachable or refusing); records "
                            "stay in the journal %s and are re-sent",
                            self._journal.directory,
                        )
                    self._failures += 1
                    self._retry_after = time.monotonic() + self._backoff
                    self._backoff = min(self._backoff * 2, _RETRY_BACKOFF[1])
                    self._settle(self._journaled, Delivery.JOURNALED)
                    return
                if self._failures:
                    logger.info("steprec: the recorder takes requests again; re-sending the journal")
                self._failures, self._backoff = 0, _RETRY_BACKOFF[0]
                sent: list[_Frame] = []
                through = self._answered
                while own and self._frames and self._frames[0].end <= end:
                    sent.append(self._frames.popleft())
                    through = sent[-1].through
                self._keep_refusals(sent, outcome.refusals)
                self._journal.acknowledge(end)
                self._settle(through, Delivery.ACKNOWLEDGED)
                if time.monotonic() < self._send_after():
                    return
