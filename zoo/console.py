"""What the user sees: one line per stage as it finishes (live progress while a long one runs), and a
summary table at the end. Every user-supplied string is escaped: rich reads `[...]` as markup."""

from __future__ import annotations

import os
import sys
import threading
import time

from rich.console import Console as RichConsole
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from zoo.errors import ZooError

_MARK = {"ok": "[green]✓[/]", "skipped": "[yellow]–[/]", "failed": "[red]✗[/]"}
HEARTBEAT_S = 60  # without a terminal (CI logs), a running stage prints one line this often


def worst_per_metric(results) -> list[str]:
    """One line per metric: its worst value over every output/prompt/signature (NaN if any is NaN),
    and how many passed."""
    from zoo.gates import METRICS, worst

    lines = []
    for metric in dict.fromkeys(g.metric for g in results):
        group = [g for g in results if g.metric == metric]
        value = worst(results, metric)
        threshold = (min if METRICS[metric].higher_is_better else max)(g.threshold for g in group)
        op = ">=" if METRICS[metric].higher_is_better else "<="
        passed = sum(g.passed for g in group)
        count = f" ({passed}/{len(group)} pass)" if len(group) > 1 else ""
        lines.append(f"{metric} {value:.7g} {op} {threshold:g}: {'pass' if passed == len(group) else 'FAIL'}{count}")
    return lines


def debug_enabled() -> bool:
    return os.environ.get("ZOO_DEBUG") == "1"


class _LiveStage:
    """A running stage: a rich progress line on a terminal, a heartbeat line every minute otherwise."""

    def __init__(self, console: RichConsole, name: str):
        self.name = name
        self.started = time.monotonic()
        self.done, self.total = 0, None
        self._stop = threading.Event()
        self._progress = None
        if console.is_terminal:
            self._progress = Progress(SpinnerColumn(), TextColumn(f"  {escape(name)}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)
            self._task = self._progress.add_task(name, total=None)
            self._progress.start()
        else:
            self._thread = threading.Thread(target=self._heartbeat, args=(console,), daemon=True)
            self._thread.start()

    def update(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total if total is not None else self.total
        if self._progress:
            self._progress.update(self._task, completed=done, total=self.total)

    def _heartbeat(self, console: RichConsole) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            count = f", {self.done}/{self.total or '?'} done" if self.done else ""
            console.print(f"  … {escape(self.name)}: running for {time.monotonic() - self.started:.0f} s{count}")

    def stop(self) -> None:
        self._stop.set()
        if self._progress:
            self._progress.stop()


class Console:
    def __init__(self, quiet: bool = False):
        self.rich = RichConsole(highlight=False, width=None if sys.stdout.isatty() else 160)
        self.quiet = quiet
        self._live: _LiveStage | None = None

    def begin(self, model: str, component: str, target: str, precision: str):
        if not self.quiet:
            self.rich.rule(escape(f"{model} · {component} → {target} · {precision}"))

    def stage_started(self, record) -> None:
        if not self.quiet:
            self._live = _LiveStage(self.rich, record.name)

    def stage_progress(self, record, done: int, total: int | None) -> None:
        if self._live is not None:
            self._live.update(done, total)

    def stage(self, record):
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self.quiet:
            return
        note = f"  [dim]{escape(record.note)}[/]" if record.note else ""
        timing = "" if record.outcome == "skipped" else f"{record.seconds:7.2f} s {record.peak_rss_mb:8.0f} MB"
        self.rich.print(f"  {_MARK.get(str(record.outcome), '?')} {escape(record.name):<22} {timing}{note}")

    def stage_log_hooks(self) -> dict:
        """Keyword arguments for a StageLog that reports to this console."""
        return {"on_finish": self.stage, "on_start": self.stage_started, "on_progress": self.stage_progress}

    def summary(self, results) -> None:
        table = Table(title="zoo: bundles and gates")
        for col in ("model", "component", "target", "precision", "status", "gates", "size", "bundle"):
            table.add_column(col)
        for r in results:
            color = {"passed": "green"}.get(str(r.status), "red")
            label = {"passed": "passed", "gate_failed": "GATE FAILED"}.get(str(r.status), "ERROR")
            status = f"[{color}]{label}[/]" + (f"\n({escape(r.note)})" if r.note else "")
            gate_text = "\n".join(worst_per_metric(r.gates)) or r.error
            table.add_row(escape(r.model), escape(r.component), r.target, r.precision, status, escape(gate_text),
                          f"{r.bytes / 2**20:.2f} MiB", escape(str(r.path or "-")))
        self.rich.print(table)
        for r in results:
            if r.traceback and debug_enabled():
                self.rich.print(f"[red]{r.target}-{r.precision}: traceback (ZOO_DEBUG=1):[/]")
                self.rich.print(escape(r.traceback))

    def error(self, exc: ZooError) -> None:
        self.rich.print(f"[bold red]error:[/] {escape(exc.problem)} [bold]Fix:[/] {escape(exc.fix)}")
