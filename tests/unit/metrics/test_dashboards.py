"""The Grafana dashboard and the Prometheus alert rules in docs/dashboards (#27) query
only metrics and labels the exporter exposes, and cover what the issue asks for."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from celery_redislock.celery.metrics.collector import exposed_series
from celery_redislock.celery.metrics.schema import KINDS, OUTCOMES

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
    # The values too: a misspelt outcome selects nothing, as silently as a wrong name.
    for label, values in (("kind", KINDS), ("outcome", OUTCOMES)):
        for value in re.findall(rf'\b{label}="([^"]*)"', expr):
            assert value in values, f"no {label} {value!r} is counted ({expr!r})"
        for pattern in re.findall(rf'\b{label}=~"([^"]*)"', expr):
            assert any(re.fullmatch(pattern, v) for v in values), f"{label}=~{pattern!r}"


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


@pytest.mark.parametrize(
    "expr",
    [
        "sum(rate(celery_redislock_lease_lost_total[5m]))",
        'sum(rate(celery_redislock_events_total{outcome="penalised"}[5m]))',
        'sum(rate(celery_redislock_events_total{kind="limiter",outcome="penalized"}[5m]))',
        'sum(rate(celery_redislock_events_total{outcome=~".*_late"}[5m]))',
    ],
)
def test_the_check_catches_a_wrong_name(expr: str) -> None:
    with pytest.raises(AssertionError):
        _check(expr)


def test_penalties_are_on_the_dashboard_and_alerted() -> None:
    """#27: a limiter penalized (a 429) is counted: the dashboard shows it per limiter."""
    queries = [e for exprs in _dashboard_queries().values() for e in exprs]
    assert any('outcome="penalized"' in e for e in queries)
    assert any('outcome="penalized"' in e for e in _rule_queries().values())
