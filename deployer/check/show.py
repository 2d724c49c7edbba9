"""`deployer check` for a person: one row per node, the verdict and why."""

from __future__ import annotations

from rich.table import Table

from .model import CheckReport

STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def table(report: CheckReport) -> Table:
    t = Table(title=f"check ({report.level}) of cluster {report.cluster}: {report.verdict}", title_justify="left")
    for col in ("node", "verdict", "why", "s"):
        t.add_column(col, justify="right" if col == "s" else "left")
    for n in report.nodes:
        t.add_row(n.name, f"[{STYLE[n.verdict]}]{n.verdict}[/]", n.reason(), f"{n.seconds or 0:.1f}")
    for f in report.cluster_findings:
        t.add_row("(cluster)", f"[{STYLE.get(f.status, '')}]{f.status}[/]", f"{f.check}: {f.detail}", "")
    return t
