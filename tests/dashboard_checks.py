"""Run every panel query of the provisioned Grafana dashboards against Prometheus, the
way Grafana would, to tell which panels have no data. Used by the monitoring tests
(tests/unit/test_monitoring_stack.py, tests/integration/test_monitoring_live.py) and the
dashboard checks; the Grafana server itself does not run on the local provider, so this
is how its dashboards are proven there.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployer.errors import OperationFailed
from deployer.paths import assets_root


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str  # uid
    panel: str  # title
    ref_id: str
    expr: str  # as written in the dashboard, $variables and all


@dataclass
class PanelCheck:
    query: PanelQuery
    expr: str  # with variables filled in
    series: int = 0
    error: str | None = None
    unresolved: list[str] = field(default_factory=list)

    @property
    def has_data(self) -> bool:
        return self.error is None and self.series > 0


def dashboards_dir() -> Path:
    """monitoring/grafana/dashboards in the repository or the installed package."""
    return assets_root() / "monitoring" / "grafana" / "dashboards"


def load_dashboards(directory: Path | None = None) -> dict[str, dict[str, Any]]:
    """{file stem: dashboard JSON} for the provisioned dashboards."""
    directory = dashboards_dir() if directory is None else directory
    return {p.stem: json.loads(p.read_text()) for p in sorted(Path(directory).glob("*.json"))}


def iter_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_queries(dashboard: Mapping[str, Any]) -> list[PanelQuery]:
    out = []
    for panel in iter_panels(dashboard):
        for t in panel.get("targets", []):
            if t.get("expr") and not t.get("hide"):
                out.append(PanelQuery(dashboard["uid"], panel.get("title", ""), t.get("refId", ""), t["expr"]))
    return out


def annotation_queries(dashboard: Mapping[str, Any]) -> list[PanelQuery]:
    """Prometheus annotation queries (the "Benchmark runs" markers)."""
    out = []
    for a in dashboard.get("annotations", {}).get("list", []):
        expr = (a.get("target") or {}).get("expr") or a.get("expr")
        if expr and a.get("enable", True):
            out.append(PanelQuery(dashboard["uid"], f"annotation: {a.get('name', '')}", "Anno", expr))
    return out


_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<sel>.+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*$", re.S)


def expand(expr: str, values: Mapping[str, str]) -> tuple[str, list[str]]:
    """Fill Grafana variables in; returns the expression and the names left unresolved."""
    missing: list[str] = []

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in values:
            return values[name]
        missing.append(name)
        return m.group(0)

    return _VAR.sub(sub, expr), missing


def _sort_values(values: list[str], sort: int) -> list[str]:
    def num(v: str) -> float:
        try:
            return float(v)
        except ValueError:
            return float("inf")

    if sort in (1, 2):
        return sorted(values, reverse=sort == 2)
    if sort in (3, 4):
        return sorted(values, key=num, reverse=sort == 4)
    return values


def resolve_variables(
    dashboard: Mapping[str, Any],
    label_values: Callable[[str | None, str], list[str]],
    *,
    rate_interval: str = "1m",
    interval: str = "15s",
    range_: str = "1h",
) -> dict[str, str]:
    """The value Grafana would select for each template variable when the dashboard opens.

    "All" (includeAll with allValue) is chosen where offered; otherwise the first
    value in the variable's sort order. `label_values(selector, label)` answers a
    label_values() query. A variable without values is left out.
    """
    values = {"__rate_interval": rate_interval, "__interval": interval, "__range": range_}
    for var in dashboard.get("templating", {}).get("list", []):
        name = var["name"]
        if var.get("type") == "constant":
            values[name] = str(var.get("query", ""))
            continue
        if var.get("type") != "query":
            continue
        if var.get("includeAll") and var.get("allValue"):
            values[name] = var["allValue"]
            continue
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        query, _ = expand(query or "", values)
        m = _LABEL_VALUES.match(query)
        if not m:
            continue
        found = _sort_values(label_values(m.group("sel"), m.group("label")), int(var.get("sort") or 0))
        if found:
            values[name] = found[0]
    return values


class PrometheusAPI:
    """The few calls of Prometheus's HTTP API that the checks need (stdlib only)."""

    def __init__(self, url: str, *, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.timeout = timeout

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=self.timeout) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:  # 400/422: a bad query; the body says why
            try:
                body = json.load(e)
            except ValueError:
                raise OperationFailed(f"Prometheus {path}: HTTP {e.code}") from None
        if body.get("status") != "success":
            raise OperationFailed(f"Prometheus {path}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        return data["result"] if data["resultType"] in ("vector", "matrix") else [data["result"]]

    def label_values(self, selector: str | None, label: str) -> list[str]:
        params: dict[str, Any] = {}
        if selector:
            params["match[]"] = selector
        return list(self.get(f"/api/v1/label/{label}/values", **params))

    def targets(self) -> list[dict[str, Any]]:
        return self.get("/api/v1/targets", state="active")["activeTargets"]


def check_dashboards(
    prometheus_url: str, dashboards: Mapping[str, Mapping[str, Any]] | None = None, *, rate_interval: str = "1m"
) -> list[PanelCheck]:
    """Run every panel and annotation query of every dashboard as an instant query; one PanelCheck each."""
    api = PrometheusAPI(prometheus_url)
    checks = []
    for dash in (dashboards or load_dashboards()).values():
        values = resolve_variables(dash, api.label_values, rate_interval=rate_interval)
        for q in panel_queries(dash) + annotation_queries(dash):
            expr, missing = expand(q.expr, values)
            check = PanelCheck(q, expr, unresolved=missing)
            if missing:
                check.error = f"no value for ${', $'.join(missing)}"
            else:
                try:
                    check.series = len(api.query(expr))
                except (OSError, OperationFailed) as e:
                    check.error = str(getattr(e, "reason", None) or e)
            checks.append(check)
    return checks
