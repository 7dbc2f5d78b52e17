"""The retrytopics Grafana dashboard, as code: `python deploy/grafana/dashboard.py` writes retrytopics.json
next to this file (committed; tests/unit/test_dashboard.py keeps the two in step, and
tests/integration/runtime/test_observability.py runs every query against a Prometheus scraping a running app).

Built with grafana-foundation-sdk (the `dashboards` extra). The variables: `datasource` (a Prometheus), `job`
(the scrape job: which app's processes), `group` (the consumer group: the main one, or a tier's) and `topic`.
"""

from __future__ import annotations

import json
from pathlib import Path

from grafana_foundation_sdk.builders.dashboard import Dashboard, DatasourceVariable, QueryVariable, Row
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.builders.stat import Panel as Stat
from grafana_foundation_sdk.builders.timeseries import Panel as TimeSeries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

OUTPUT = Path(__file__).with_name("retrytopics.json")
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
JOB = 'job=~"$job"'
SCOPE = f'{JOB}, topic=~"$topic"'
RATE = "[$__rate_interval]"


def _query(expr: str, legend: str) -> Dataquery:
    return Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def _series(title: str, unit: str, description: str, *queries: Dataquery, width: int = 12) -> TimeSeries:
    panel = TimeSeries().title(title).description(description).unit(unit).min(0).height(8).span(width)
    for query in queries:
        panel = panel.with_target(query)
    return panel.datasource(DATASOURCE)


def _variable(name: str, label: str, query: str) -> QueryVariable:
    return (
        QueryVariable(name)
        .label(label)
        .query(query)
        .datasource(DATASOURCE)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def build() -> Dashboard:
    """The dashboard: pipeline at a glance, tiers, lag, failures, health."""
    calls = f"sum(rate(retrytopics_records_handled_total{{{JOB}}}{RATE})) + sum(rate(retrytopics_records_failed_total{{{JOB}}}{RATE}))"
    return (
        Dashboard("retrytopics")
        .uid("retrytopics")
        .description("Non-blocking retries on Kafka: source, tiers and DLQ (docs/operations.md, Metrics)")
        .tags(["retrytopics", "kafka"])
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(DatasourceVariable("datasource").label("Data source").type("prometheus"))
        .with_variable(_variable("job", "App (scrape job)", "label_values(retrytopics_healthy, job)"))
        .with_variable(
            _variable("group", "Consumer group", 'label_values(retrytopics_partition_lag_records{job=~"$job"}, group)')
        )
        .with_variable(
            _variable(
                "topic",
                "Topic",
                'label_values(retrytopics_partition_lag_records{job=~"$job", group=~"$group"}, topic)',
            )
        )
        .with_row(Row("Pipeline at a glance"))
        .with_panel(
            _series(
                "Source → tiers → DLQ",
                "ops",
                "First attempts on the source topics, republishes to each tier, and records dead-lettered, per second",
                _query(f"sum(rate(retrytopics_first_attempts_total{{{SCOPE}}}{RATE}))", "first attempts"),
                _query(
                    f"sum by (tier_topic) (rate(retrytopics_records_retried_total{{{SCOPE}}}{RATE}))",
                    "→ {{tier_topic}}",
                ),
                _query(f"sum(rate(retrytopics_records_dead_lettered_total{{{SCOPE}}}{RATE}))", "→ DLQ"),
                width=16,
            )
        )
        .with_panel(
            Stat()
            .title("Retry amplification")
            .description("Handler calls per first attempt (1: no retries); above 3 for 15 minutes alerts")
            .with_target(
                _query(f"({calls}) / sum(rate(retrytopics_first_attempts_total{{{JOB}}}{RATE}))", "calls / first")
            )
            .datasource(DATASOURCE)
            .decimals(2)
            .height(8)
            .span(4)
        )
        .with_panel(
            Stat()
            .title("Health")
            .description("retrytopics_healthy per process: 1 healthy, 0 not (app.healthy)")
            .with_target(_query(f"min by (job, instance) (retrytopics_healthy{{{JOB}}})", "{{instance}}"))
            .datasource(DATASOURCE)
            .height(8)
            .span(4)
        )
        .with_row(Row("Tiers"))
        .with_panel(
            _series(
                "Oldest due record, per tier",
                "s",
                "How long the oldest tier record that is due but not handled has been due (0: none); "
                "above 120 s alerts (RetrytopicsTierStuck)",
                _query(f"max by (topic) (retrytopics_tier_oldest_due_age_seconds{{{SCOPE}}})", "{{topic}}"),
                width=8,
            )
        )
        .with_panel(
            _series(
                "Lateness p99, per tier",
                "s",
                "handled_at - due_at of retried records (SLO: p99 <= 100 ms)",
                _query(
                    "histogram_quantile(0.99, sum by (topic, le) "
                    f"(rate(retrytopics_lateness_seconds_bucket{{{SCOPE}}}{RATE})))",
                    "{{topic}}",
                ),
                width=8,
            )
        )
        .with_panel(
            _series(
                "Paused partitions",
                "short",
                "Partitions waiting for a due time, or held while a publish fails",
                _query(f"sum by (topic) (retrytopics_paused_partitions{{{SCOPE}}})", "{{topic}}"),
                width=8,
            )
        )
        .with_row(Row("Lag"))
        .with_panel(
            _series(
                "Lag in seconds",
                "s",
                "Age of the first unhandled record, per group and topic (a tier's includes its delay); "
                "measured by the consumers, true while paused",
                _query(
                    'max by (group, topic) (retrytopics_partition_lag_seconds{job=~"$job", group=~"$group", '
                    'topic=~"$topic"})',
                    "{{group}} {{topic}}",
                ),
            )
        )
        .with_panel(
            _series(
                "Records waiting",
                "short",
                "Records after the first unhandled one, per group and topic (on a tier: records waiting there)",
                _query(
                    'sum by (group, topic) (retrytopics_partition_lag_records{job=~"$job", group=~"$group", '
                    'topic=~"$topic"})',
                    "{{group}} {{topic}}",
                ),
            )
        )
        .with_row(Row("Failures"))
        .with_panel(
            _series(
                "Failures by exception type",
                "ops",
                "Handler calls that raised, per second, by exception class",
                _query(
                    f"sum by (exception) (rate(retrytopics_handler_failures_total{{{SCOPE}}}{RATE}))", "{{exception}}"
                ),
            )
        )
        .with_panel(
            _series(
                "DLQ by reason",
                "ops",
                "Records dead-lettered per second, by reason; above 0 for 10 minutes alerts",
                _query(
                    f"sum by (reason) (rate(retrytopics_records_dead_lettered_total{{{SCOPE}}}{RATE}))", "{{reason}}"
                ),
            )
        )
    )


def render() -> str:
    """The dashboard's JSON, as committed."""
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    OUTPUT.write_text(render())
