"""What `deployer check` found, typed: a finding per check per node, a verdict per node
and one for the cluster. The record (check.json in the state dir, `check --json`) is
`CheckReport.to_record()`; `deployer up --replace-failed` reads the failed nodes back.

A verdict is the worst of its findings: fail > warn > pass (skip says nothing). A node
that fails is named with its first failing finding, and with the command that replaces it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

Status = Literal["pass", "warn", "fail", "skip"]
LEVELS = ("quick", "standard", "full")
SCHEMA = 1
_RANK = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}


def worst(statuses: list[Status]) -> Status:
    """The verdict of several findings: fail > warn > pass; only skips (or none): pass."""
    top: Status = max(statuses, key=_RANK.__getitem__, default="pass")
    return "pass" if top == "skip" else top


@dataclass(frozen=True)
class Finding:
    check: str
    status: Status
    detail: str
    value: Any = None

    @staticmethod
    def parse(data: dict[str, Any]) -> Finding:
        status = cast(Status, data.get("status") if data.get("status") in _RANK else "fail")
        return Finding(str(data.get("check", "?")), status, str(data.get("detail", "")), data.get("value"))


@dataclass
class NodeReport:
    name: str
    findings: list[Finding] = field(default_factory=list)
    seconds: float | None = None

    @property
    def verdict(self) -> Status:
        return worst([f.status for f in self.findings])

    def first(self, status: Status) -> Finding | None:
        return next((f for f in self.findings if f.status == status), None)

    def reason(self) -> str:
        """The first failing finding (else the first warning): what to say of the node."""
        f = self.first("fail") or self.first("warn")
        return f"{f.check}: {f.detail}" if f else "all checks passed"


@dataclass
class CheckReport:
    cluster: str
    level: str
    at: str  # ISO UTC, when it started
    nodes: list[NodeReport]
    cluster_findings: list[Finding] = field(default_factory=list)  # what no single node holds (the matrix, the collective)
    seconds: float | None = None

    @property
    def verdict(self) -> Status:
        return worst([n.verdict for n in self.nodes] + [f.status for f in self.cluster_findings])

    def failed(self) -> list[str]:
        return [n.name for n in self.nodes if n.verdict == "fail"]

    def to_record(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "cluster": self.cluster, "level": self.level, "at": self.at, "seconds": self.seconds,
                "verdict": self.verdict,
                "nodes": [{"name": n.name, "verdict": n.verdict, "reason": n.reason(), "seconds": n.seconds,
                           "findings": [asdict(f) for f in n.findings]} for n in self.nodes],
                "cluster_findings": [asdict(f) for f in self.cluster_findings]}

    @staticmethod
    def from_record(data: dict[str, Any]) -> CheckReport:
        nodes = [NodeReport(n["name"], [Finding.parse(f) for f in n["findings"]], n.get("seconds")) for n in data["nodes"]]
        return CheckReport(data["cluster"], data["level"], data["at"], nodes,
                           [Finding.parse(f) for f in data.get("cluster_findings", [])], data.get("seconds"))
