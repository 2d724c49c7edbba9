"""Alerting rules: promtool accepts them and its unit tests show each alert firing when it should.

Needs promtool (Debian/Ubuntu: `apt-get install prometheus`); skipped without it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROM = REPO / "monitoring" / "prometheus"
RULE_FILES = sorted((PROM / "rules").glob("*.yml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)")


def test_the_promised_alerts_exist():
    names = {r["alert"] for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r}
    assert {"NodeDown", "DiskFillingUp", "GpuTooHot", "ScrapeFailing", "NodeHealthFailing", "NodeHealthStale"} <= names


def test_every_alert_has_severity_summary_and_description():
    for f in RULE_FILES:
        for g in yaml.safe_load(f.read_text())["groups"]:
            for r in g["rules"]:
                assert r["labels"]["severity"] in {"critical", "warning", "info"}, r["alert"]
                assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
                assert "for" in r, f"{r['alert']}: no `for:`, it would fire on one bad scrape"


@needs_promtool
@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules(path):
    r = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_promtool_rule_unit_tests():
    r = subprocess.run([PROMTOOL, "test", "rules", "deployer.rules.test.yml"], cwd=PROM / "tests",
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
