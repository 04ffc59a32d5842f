"""The supervisor: keeps each worker group running through its driver, and says why
a worker went away.

The group loop asks it, on every pass, to ``refresh`` (read the driver's ``list``
once), to ``ensure_running`` the groups of ACTIVE and UNBOUND keys, to ``stop`` a
drained STOPPED key's group, and to ``retain`` only the groups it still tracks. A
worker that exits is judged by how it ended:

- **processing timeout**: it exited with ``PROCESSING_TIMEOUT_EXIT`` (``serve``'s
  watchdog saw a request run past ``--processing-timeout``): its delivery went back
  to the broker with its count risen; the worker is replaced at once; counted.
- **start failure**: it exited before it reported itself ready (the ``started``
  activity report that ``serve`` posts, and waits the ACK of, before it takes a
  request): the calls waiting for its key are failed now with the exit status and the
  tail of its stderr (``on_start_failure``), and it is restarted after a back-off
  that doubles per failure of that key; counted.
- **crash**: it exited after it was ready: restarted after the back-off; its
  delivery was redelivered by the broker (the poison rule ends endless cases).

- **frozen** (with a processing timeout): a ready worker that announced ``alive``
  reports (``serve`` sends one every ``alive_interval`` of the timeout, from a thread
  of its own) and then sent no report at all for longer than the processing timeout
  (plus one interval, for the reports' way through the broker) is stopped whole
  (SIGSTOP, a debugger, a handler holding the GIL in C: its watchdog cannot act
  either). Its process group is killed at once (the driver's ``kill``) and a fresh
  worker started in the same pass; its delivery goes back to the broker when its
  link closes; one WARNING; counted. While the manager's own link to the broker is
  down no report can arrive, so that time does not count.

A ready report resets the key's back-off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from holdfast.pool.drivers import WorkerGroup, WorkerGroupDriver, WorkerInfo
from holdfast.sdk.poolnames import PROCESSING_TIMEOUT_EXIT

log = logging.getLogger(__name__)

RESTART_INITIAL = 0.5
RESTART_MAXIMUM = 30.0
"""Back-off, in seconds, before restarting a worker that exited (doubling)."""

VERDICT_DELAY = 0.5
"""Seconds after an exit during which a late ``started`` report still makes it a
crash rather than a start failure (reports travel through the broker)."""

MAX_TAIL_CHARS = 800
"""Characters of a failed worker's stderr carried in the callers' error."""


@dataclass(slots=True)
class _Slot:
    group: WorkerGroup
    running: WorkerInfo | None = None
    ready: bool = False
    exited: WorkerInfo | None = None
    exited_at: float = 0.0
    failures: int = 0
    retry_at: float = 0.0
    last_seen: float = 0.0
    alive_every: float | None = None
    """The worker's ``alive`` interval, from its ``started`` report (None: judged
    never frozen: it sends none)."""


class Supervisor:
    """Runs worker groups through a driver (see the module docstring). Thread-safe;
    called from the group loop, and from the activity consumer (``ready``)."""

    def __init__(
        self,
        driver: WorkerGroupDriver,
        on_start_failure: Callable[[WorkerGroup, str], None],
        on_start: Callable[[WorkerGroup], None],
        clock: Callable[[], float] = time.monotonic,
        frozen_after: float | None = None,
        linked: Callable[[], bool] = lambda: True,
    ) -> None:
        self.driver = driver
        self.frozen_after = frozen_after
        """Seconds of silence after which a worker is judged frozen (the processing
        timeout; None: never)."""
        self._linked = linked
        self._on_start_failure = on_start_failure
        self._on_start = on_start
        self._clock = clock
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        self.starts = 0
        """Workers started (restarts included)."""
        self.crashes = 0
        self.start_failures = 0
        self.processing_timeouts = 0
        """Workers replaced because a request ran past the processing timeout."""
        self.frozen = 0
        """Workers killed and replaced because they were silent past the timeout."""

    def refresh(self) -> list[WorkerInfo]:
        """Read the driver's view once: judge the workers that exited; return the
        listed workers of groups this supervisor does not know (an earlier
        manager's, or exited ones the driver still lists after a ``stop_all``)."""
        listed = self.driver.list()
        strangers = []
        with self._lock:
            for info in listed:
                slot = self._slots.get(info.worker_id)
                if slot is None:
                    strangers.append(info)
                elif (
                    slot.running is not None
                    and slot.running.handle == info.handle
                    and info.exit_status is not None
                ):
                    slot.running, slot.exited, slot.exited_at = None, info, self._clock()
        for slot in self._pending_verdicts():
            self._judge(slot)
        self._replace_frozen()
        return strangers

    def adopt(self, group: WorkerGroup, info: WorkerInfo) -> None:
        """Keep a running worker an earlier manager started (the driver adopted it)."""
        with self._lock:
            self._slots[group.worker_id] = _Slot(group, running=info, ready=True)

    def ready(self, worker_id: str, alive_every: float | None = None) -> None:
        """``worker_id`` reported itself ready (``started``), and reports ``alive``
        every ``alive_every`` seconds (None: it does not)."""
        with self._lock:
            slot = self._slots.get(worker_id)
            if slot is not None:
                slot.ready, slot.failures = True, 0
                slot.alive_every, slot.last_seen = alive_every, self._clock()

    def seen(self, worker_id: str) -> None:
        """``worker_id`` sent a report: it is not frozen."""
        with self._lock:
            slot = self._slots.get(worker_id)
            if slot is not None:
                slot.last_seen = self._clock()

    def ensure_running(self, group: WorkerGroup) -> None:
        """Start ``group``'s worker unless it runs, is being judged or backs off."""
        with self._lock:
            slot = self._slots.setdefault(group.worker_id, _Slot(group))
            if slot.running is not None or slot.exited is not None:
                return
            if self._clock() < slot.retry_at:
                return
        self._on_start(group)
        try:
            info = self.driver.start(group)
        except OSError as error:  # the driver could not even start it
            info = WorkerInfo(group.worker_id, group.key, "", time.time(), -1, str(error))
            with self._lock:
                slot.exited, slot.exited_at = info, self._clock() - VERDICT_DELAY
            self._judge(slot)
            return
        with self._lock:
            slot.running, slot.ready = info, False
            self.starts += 1

    def stop(self, group: WorkerGroup) -> None:
        """Stop ``group``'s worker and forget it."""
        with self._lock:
            self._slots.pop(group.worker_id, None)
        self.driver.stop(group.worker_id)
        self._on_start(group)  # nothing to fail on its behalf any more

    def retain(self, worker_ids: Iterable[str]) -> None:
        """Stop every group not in ``worker_ids`` (keys the tracker no longer has)."""
        keep = set(worker_ids)
        with self._lock:
            gone = [slot.group for wid, slot in self._slots.items() if wid not in keep]
        for group in gone:
            log.info("worker %s (key %r) is tracked no more: stopped", group.worker_id, group.key)
            self.stop(group)

    def stop_all(self) -> None:
        """Stop every group (this manager is no longer the active one)."""
        self.retain(())

    def _replace_frozen(self) -> None:
        """Kill and replace the workers silent past ``frozen_after`` (module docstring)."""
        if self.frozen_after is None:
            return
        now = self._clock()
        with self._lock:
            if not self._linked():  # no report can reach us: the silence is ours
                for slot in self._slots.values():
                    slot.last_seen = now
                return
            frozen = [
                slot
                for slot in self._slots.values()
                if slot.running is not None
                and slot.ready
                and slot.alive_every is not None
                and now - slot.last_seen > self.frozen_after + slot.alive_every
            ]
        kill: Callable[[str], None] = getattr(self.driver, "kill", self.driver.stop)
        for slot in frozen:
            group = slot.group
            log.warning(
                "worker %s (key %r) sent nothing for %.1f s, past the processing timeout "
                "(%.1f s): frozen; its process group is killed and a fresh worker started",
                group.worker_id,
                group.key[:64],
                now - slot.last_seen,
                self.frozen_after,
            )
            kill(group.worker_id)
            with self._lock:
                slot.running, slot.ready, slot.alive_every = None, False, None
                slot.exited, slot.retry_at = None, now
                self.frozen += 1

    def _pending_verdicts(self) -> list[_Slot]:
        with self._lock:
            return [slot for slot in self._slots.values() if slot.exited is not None]

    def _judge(self, slot: _Slot) -> None:
        exited, now = slot.exited, self._clock()
        assert exited is not None
        group = slot.group
        if exited.exit_status == PROCESSING_TIMEOUT_EXIT:
            verdict = "processing timeout"
            self.processing_timeouts += 1
            log.warning(
                "worker %s (key %r) ran a request past the processing timeout: replaced; "
                "the request goes back to the broker",
                group.worker_id,
                group.key[:64],
            )
        elif not slot.ready and now - slot.exited_at < VERDICT_DELAY:
            return  # a started report may still be on its way
        elif slot.ready:
            verdict = "crash"
            self.crashes += 1
        else:
            verdict = "start failure"
            self.start_failures += 1
        with self._lock:
            if verdict != "processing timeout":
                slot.failures += 1
            delay = (
                min(RESTART_INITIAL * 2 ** (slot.failures - 1), RESTART_MAXIMUM)
                if slot.failures
                else 0.0
            )
            slot.exited, slot.retry_at = None, now + delay
        if verdict == "crash":
            log.warning(
                "worker %s (key %r) exited with %s; restarting in %.1f s",
                group.worker_id,
                group.key[:64],
                exited.exit_status,
                delay,
            )
        elif verdict == "start failure":
            text = start_failure_text(group, exited)
            log.error("%s; retrying in %.1f s", text, delay)
            self._on_start_failure(group, text)


def start_failure_text(group: WorkerGroup, exited: WorkerInfo) -> str:
    """What the callers of a key whose worker could not start are told."""
    tail = exited.output_tail.strip()[-MAX_TAIL_CHARS:]
    return (
        f"pool {group.pool}, key {group.key[:64]!r}: worker {group.worker_id} exited with "
        f"status {exited.exit_status} before it was ready; "
        + (f"its stderr ends with:\n{tail}" if tail else "it wrote nothing to stderr")
    )


__all__ = ["RESTART_INITIAL", "RESTART_MAXIMUM", "Supervisor", "start_failure_text"]
