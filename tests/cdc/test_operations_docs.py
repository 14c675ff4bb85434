"""docs/OPERATIONS.md, the alert rules and the dashboard agree with what the
sidecar exports: every metric is documented, and every series the rules and
the dashboard query is one that a running sidecar's /metrics has (names
read from a real daemon with tables, over HTTP). ``promtool`` checks the
rules and runs their unit tests (Debian's ``prometheus`` package;
scripts/ensure-servers.sh installs it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cdc.config import parse_config
from cdc.daemon import Daemon
from cdc.devservers import free_port
from cdc.metrics import Metrics
from cdc.sources.memory import MemorySource
from tests.e2e import wait_for

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "OPERATIONS.md"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "cdc-sync.json"

# What Prometheus itself adds to every target: not the sidecar's to export.
PROMETHEUS_OWN = {"up"}
# PromQL words that look like series names.
KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
}


def exported_names(text: str) -> set[str]:
    """Every sample name of a /metrics text (``_total``, ``_bucket`` and so on included)."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def series_in(expr: str) -> set[str]:
    """The series names a PromQL expression selects."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\$\w+", "", expr)  # dashboard variables
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set(re.findall(r"(?<![\w.])([a-zA-Z_:][\w:]*)\b(?!\s*\()", expr))
    return {n for n in names if n not in KEYWORDS and not re.fullmatch(r"\d+\w*", n)}


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:  # Grafana's label_values(series, label)
        found = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable.get("definition", ""))
        if found:
            exprs.append(found.group(1))
    return exprs


async def scraped_names(redis_url: str, namespace: str, wanted: set[str]) -> set[str]:
    """/metrics of a sidecar running two tables, once a change of each is
    applied and the slow gauges (dead letters, retention) were read: once
    ``wanted`` is there, or what is there after 15 s."""
    tables = ["mem.a", "mem.b"]
    text = (
        "source:\n  kind: postgres\n  dsn: unused\n"
        f"redis:\n  url: {redis_url}\n  namespace: {namespace}\n"
        f"worker:\n  health: 127.0.0.1:{free_port()}\n  lease_ttl: 1s\n"
        "tables:\n"
        + "".join(
            f"  - table: {t}\n    partition: p\n    section: {t[4:]}\n    backoff: [[null, 10ms]]\n"
            for t in tables
        )
    )
    config = parse_config(text, "<test>", {})
    source = MemorySource()
    source.retention_seconds = 86400.0
    for table in tables:
        source.create_table(table, {"id": "int", "n": "int"}, ["id"])
    await source.tracking_enable(config.tables)
    daemon = Daemon(config, source=source, worker_id="docs")
    task = asyncio.create_task(daemon.run())
    assert config.worker.health is not None
    url = f"http://127.0.0.1:{config.worker.health[1]}/metrics"
    try:

        def scrape() -> str:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    return str(response.read().decode())
            except OSError:
                return ""  # not serving yet

        async def caught_up() -> bool:
            return len(daemon.balancer.owned()) == len(tables) and daemon.readyz()[0]

        await wait_for(caught_up, 15, "the sidecar to be ready")
        for table in tables:
            source.insert(table, {"id": 1, "n": 1})
        names: set[str] = set()

        async def complete() -> bool:
            nonlocal names
            await daemon.observer.refresh_slow_metrics()
            await daemon.observer.refresh_metrics()
            names = exported_names(await asyncio.to_thread(scrape))
            return wanted <= names

        with contextlib.suppress(AssertionError):  # the caller names what is missing
            await wait_for(complete, 15, "every series to be exported")
        return names
    finally:
        daemon.request_stop()
        await task


@pytest.fixture(scope="module")
def documented() -> str:
    return OPERATIONS.read_text(encoding="utf-8")


def test_every_metric_is_documented(documented: str) -> None:
    """Each sample name of the sidecar's registry (the process and GC
    collectors' too) is written in docs/OPERATIONS.md."""
    metrics = Metrics()
    names = exported_names(metrics.render().decode())
    families = {f.name for f in text_string_to_metric_families(metrics.render().decode())}
    missing = sorted(
        family
        for family in families
        if not family.endswith("_created")
        and not any(name in documented for name in names if name.startswith(family))
        and family not in documented
    )
    assert not missing, f"not in docs/OPERATIONS.md: {missing}"
    for name in ("cdc_changes_read_total", "cdc_lag_seconds", "cdc_up", "process_resident_memory_bytes"):
        assert f"`{name}" in documented


async def test_the_rules_and_the_dashboard_use_only_what_the_sidecar_exports(
    redis_url: str, namespace: str
) -> None:
    used = {name for expr in rule_exprs() + dashboard_exprs() for name in series_in(expr)}
    assert {"cdc_up", "cdc_lag_seconds", "cdc_apply_latency_seconds_bucket"} <= used  # the parsing works
    exported = await scraped_names(redis_url, namespace, used - PROMETHEUS_OWN)
    unknown = sorted(used - exported - PROMETHEUS_OWN)
    assert not unknown, f"used by deploy/ but not exported by the sidecar: {unknown}"


def test_every_alert_has_a_runbook_section(documented: str) -> None:
    """Each rule's ``runbook`` links to a heading of docs/OPERATIONS.md
    (GitHub's anchors: lower case, spaces to dashes, punctuation dropped)."""
    anchors = {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", documented, flags=re.MULTILINE)
    }
    groups = yaml.safe_load(RULES.read_text())["groups"]
    for rule in (rule for group in groups for rule in group["rules"]):
        path, _, anchor = rule["annotations"]["runbook"].partition("#")
        assert path == "docs/OPERATIONS.md" and anchor in anchors, (rule["alert"], anchor)


def test_the_dashboard_asks_for_its_prometheus_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(
            "promtool is not installed (Debian: apt-get install prometheus; scripts/ensure-servers.sh does)"
        )
    return path


@pytest.mark.parametrize("command", [["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]])
def test_promtool_accepts_the_rules(command: list[str]) -> None:
    result = subprocess.run([promtool(), *command], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
