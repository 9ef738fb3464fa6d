"""What the user sees: one line per stage as it finishes, and a summary table at the end."""

from __future__ import annotations

import sys

from rich.console import Console as RichConsole
from rich.table import Table

from zoo.errors import ZooError

_MARK = {"ok": "[green]✓[/]", "skipped": "[yellow]–[/]", "failed": "[red]✗[/]"}


class Console:
    def __init__(self, quiet: bool = False):
        self.rich = RichConsole(highlight=False, width=None if sys.stdout.isatty() else 160)
        self.quiet = quiet

    def begin(self, model: str, component: str, target: str, precision: str):
        if not self.quiet:
            self.rich.rule(f"{model} · {component} → {target} · {precision}")

    def stage(self, record):
        if self.quiet:
            return
        note = f"  [dim]{record.note}[/]" if record.note else ""
        timing = "" if record.outcome == "skipped" else f"{record.seconds:7.2f} s {record.peak_rss_mb:8.0f} MB"
        self.rich.print(f"  {_MARK.get(record.outcome, '?')} {record.name:<22} {timing}{note}")

    def summary(self, results) -> None:
        table = Table(title="zoo: bundles and gates")
        for col in ("model", "component", "target", "precision", "status", "gates", "size", "bundle"):
            table.add_column(col)
        for r in results:
            status = {"passed": "[green]passed[/]", "gate_failed": "[red]GATE FAILED[/]"}.get(r.status, "[red]ERROR[/]")
            gate_text = "\n".join(g.describe().split(": ", 1)[1] for g in r.gates) or r.error
            table.add_row(r.model, r.component, r.target, r.precision, status, gate_text,
                          f"{r.bytes / 2**20:.2f} MiB", str(r.path or "-"))
        self.rich.print(table)

    def error(self, exc: ZooError) -> None:
        self.rich.print(f"[bold red]error:[/] {exc.problem} [bold]Fix:[/] {exc.fix}")
