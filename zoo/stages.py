"""Per-stage bookkeeping: wall time, peak RSS and outcome of every pipeline stage.

Peak RSS is sampled by a background thread while the stage runs, so each stage reports its own
high-water mark rather than the process's lifetime maximum. A stage can report countable progress
(`record.progress(done, total)`, e.g. weights palettized); the console shows it live with the elapsed
time, so a 20-minute stage is never silent.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

from zoo.bundle import pause_here_for_tests
from zoo.schema import StageOutcome


@dataclass
class StageRecord:
    name: str
    outcome: StageOutcome = StageOutcome.RUNNING
    seconds: float = 0.0
    peak_rss_mb: float = 0.0
    note: str = ""
    listener: object = field(default=None, repr=False, compare=False)  # callable(record, done, total) | None

    def progress(self, done: int, total: int | None = None) -> None:
        """Countable work inside the stage (thread-safe enough for a display: two ints)."""
        if self.listener:
            self.listener(self, done, total)


class _RssSampler(threading.Thread):
    def __init__(self, interval_s: float = 0.02):
        super().__init__(daemon=True)
        self._process = psutil.Process()
        self._stop_event = threading.Event()
        self.interval_s = interval_s
        self.peak = self._process.memory_info().rss

    def run(self):
        while not self._stop_event.wait(self.interval_s):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, self._process.memory_info().rss)


@dataclass
class StageLog:
    """Ordered stage records of one run, plus an optional callback that prints each as it finishes."""

    records: list[StageRecord] = field(default_factory=list)
    on_finish: object = None    # callable(StageRecord) | None
    on_start: object = None     # callable(StageRecord) | None: a live display starts
    on_progress: object = None  # callable(StageRecord, done, total) | None

    @contextmanager
    def stage(self, name: str):
        record = StageRecord(name, listener=self.on_progress)
        self.records.append(record)
        if self.on_start:
            self.on_start(record)
        sampler = _RssSampler()
        sampler.start()
        start = time.perf_counter()
        try:
            pause_here_for_tests(name)  # no-op unless a fault-injection test asks to stop here
            yield record
        except BaseException as exc:
            record.outcome = StageOutcome.FAILED
            message = getattr(exc, "problem", None) or str(exc)  # a ZooError's fix is printed once, at the end
            record.note = record.note or f"{type(exc).__name__}: {message}".splitlines()[0][:500]
            raise
        else:
            if record.outcome == StageOutcome.RUNNING:
                record.outcome = StageOutcome.OK
        finally:
            record.seconds = round(time.perf_counter() - start, 3)
            record.peak_rss_mb = round(sampler.stop() / 2**20, 1)
            if self.on_finish:
                self.on_finish(record)

    def skip(self, name: str, reason: str) -> StageRecord:
        """A stage that did not run is recorded with its reason, never silently left out."""
        record = StageRecord(name, outcome=StageOutcome.SKIPPED, note=reason)
        self.records.append(record)
        if self.on_finish:
            self.on_finish(record)
        return record

    def as_dicts(self) -> list[dict]:
        return [{"name": r.name, "outcome": str(r.outcome), "seconds": r.seconds, "peak_rss_mb": r.peak_rss_mb,
                 "note": r.note} for r in self.records]
