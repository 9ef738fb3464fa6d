"""Per-stage bookkeeping: wall time, peak RSS and outcome of every pipeline stage.

Peak RSS is sampled by a background thread while the stage runs, so each stage reports its own
high-water mark rather than the process's lifetime maximum.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import psutil

from zoo.bundle import pause_here_for_tests


@dataclass
class StageRecord:
    name: str
    outcome: str = "running"  # ok | skipped | failed
    seconds: float = 0.0
    peak_rss_mb: float = 0.0
    note: str = ""


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
    on_finish: object = None  # callable(StageRecord) | None

    @contextmanager
    def stage(self, name: str):
        record = StageRecord(name)
        self.records.append(record)
        sampler = _RssSampler()
        sampler.start()
        start = time.perf_counter()
        try:
            pause_here_for_tests(name)  # no-op unless a fault-injection test asks to stop here
            yield record
        except BaseException as exc:
            record.outcome = "failed"
            message = getattr(exc, "problem", None) or str(exc)  # a ZooError's fix is printed once, at the end
            record.note = record.note or f"{type(exc).__name__}: {message}".splitlines()[0][:500]
            raise
        else:
            if record.outcome == "running":
                record.outcome = "ok"
        finally:
            record.seconds = round(time.perf_counter() - start, 3)
            record.peak_rss_mb = round(sampler.stop() / 2**20, 1)
            if self.on_finish:
                self.on_finish(record)

    def skip(self, name: str, reason: str) -> StageRecord:
        """A stage that did not run is recorded with its reason, never silently left out."""
        record = StageRecord(name, outcome="skipped", note=reason)
        self.records.append(record)
        if self.on_finish:
            self.on_finish(record)
        return record

    def as_dicts(self) -> list[dict]:
        return [asdict(r) for r in self.records]
