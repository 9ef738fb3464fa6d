"""What the user sees: one line per stage as it finishes, and a summary table at the end."""

from __future__ import annotations

import sys

from rich.console import Console as RichConsole
from rich.table import Table

from zoo.errors import ZooError

_MARK = {"ok": "[green]✓[/]", "skipped": "[yellow]–[/]", "failed": "[red]✗[/]"}


def worst_per_metric(results) -> list[str]:
    """One line per metric: its worst value over every output/prompt/signature, and how many passed."""
    from zoo.gates import METRICS

    lines = []
    for metric in dict.fromkeys(g.metric for g in results):
        group = [g for g in results if g.metric == metric]
        pick = min if METRICS[metric].higher_is_better else max
        worst = pick(group, key=lambda g: (g.value if g.value == g.value else (-1e300 if pick is min else 1e300)))
        op = ">=" if METRICS[metric].higher_is_better else "<="
        passed = sum(g.passed for g in group)
        count = f" ({passed}/{len(group)} pass)" if len(group) > 1 else ""
        lines.append(f"{metric} {worst.value:.7g} {op} {worst.threshold:g}: {'pass' if passed == len(group) else 'FAIL'}{count}")
    return lines


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
            gate_text = "\n".join(worst_per_metric(r.gates)) or r.error
            table.add_row(r.model, r.component, r.target, r.precision, status, gate_text,
                          f"{r.bytes / 2**20:.2f} MiB", str(r.path or "-"))
        self.rich.print(table)

    def error(self, exc: ZooError) -> None:
        self.rich.print(f"[bold red]error:[/] {exc.problem} [bold]Fix:[/] {exc.fix}")
