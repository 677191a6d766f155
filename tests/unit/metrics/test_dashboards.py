"""The Grafana dashboard and the Prometheus alert rules in docs/dashboards (#27) query
only metrics and labels the exporter exposes, and cover what the issue asks for."""

from __future__ import annotations

import json
import re
from pathlib import Path

from celery_redislock.celery.metrics.collector import exposed_series

DASHBOARDS = Path(__file__).resolve().parents[3] / "docs" / "dashboards"
METRIC = re.compile(r"\bcelery_redislock_[a-z_]+")
LABELS = {"kind", "name", "outcome", "pool", "limiter", "le"}


def _dashboard_queries() -> dict[str, list[str]]:
    dashboard = json.loads((DASHBOARDS / "celery_redislock.json").read_text())
    return {p["title"]: [t["expr"] for t in p["targets"]] for p in dashboard["panels"]}


def _rule_queries() -> dict[str, str]:
    text = (DASHBOARDS / "alerts.yml").read_text()
    alerts = re.findall(r"- alert: (\w+)\n\s+expr: (.+)", text)
    assert alerts, "no alert rule found"
    return dict(alerts)


def _check(expr: str) -> None:
    metrics = set(METRIC.findall(expr))
    assert metrics, f"no celery_redislock metric in {expr!r}"
    assert metrics <= exposed_series(), f"unknown {metrics - exposed_series()} in {expr!r}"
    by = {
        label.strip() for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(",")
    }
    selected = set(re.findall(r"[{,]\s*([a-z_]+)\s*=~?", expr))
    assert by | selected <= LABELS, f"unknown labels {(by | selected) - LABELS} in {expr!r}"


def test_every_dashboard_query_uses_exposed_metrics() -> None:
    queries = _dashboard_queries()
    assert len(queries) >= 5
    for exprs in queries.values():
        for expr in exprs:
            _check(expr)


def test_every_alert_uses_exposed_metrics() -> None:
    for expr in _rule_queries().values():
        _check(expr)


def test_the_issue_s_panels_are_there() -> None:
    titles = " | ".join(_dashboard_queries()).lower()
    for topic in ("backlog age", "lost leases", "parked runs", "hand-off latency", "rate-limited"):
        assert topic in titles, topic


def test_the_check_catches_a_wrong_name() -> None:
    try:
        _check("sum(rate(celery_redislock_lease_lost_total[5m]))")
    except AssertionError:
        return
    raise AssertionError("a query on a metric the exporter does not expose passed")
