"""The Alerts page under AppTest: without an evaluator it says so; with the history the alerting
package wrote it shows the firing, pending and resolved alerts, their changes, silences made and
expired from its form; the Overview counts the same firing alerts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from alerts.store import silences
from dashboard.context import use_stores
from fleetscope.settings import load_settings
from migrations import clickhouse_runner
from storage.catalog import add_annotation
from tests.dashboard.apptest import ROOT, run, seed_alerts, window


def test_alerts_page_without_an_evaluator_says_it_has_not_run(ch, sessions) -> None:
    clickhouse_runner.apply(ch)
    use_stores(ch, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("alerts", range="1h")
    assert not at.exception and not at.error
    assert {m.label: m.value for m in at.metric} == {
        "Firing": "0",
        "Pending": "0",
        "Active silences": "0",
        "Notifications pending or failed": "0",
    }
    infos = " ".join(i.value for i in at.info)
    assert "No alert is firing or pending" in infos and "`fleetscope alerts run`" in infos
    assert "No alert changed state" in infos and "No notification yet" in infos
    assert {m.label: m.value for m in run("overview", range="1h").metric}["Firing alerts"] == "0"  # zero, not "–"


def test_alerts_page_shows_what_the_evaluator_left(ch, sessions) -> None:
    clickhouse_runner.apply(ch)
    now = seed_alerts(ch, sessions)
    add_annotation(sessions, now - timedelta(minutes=25), "deploy vllm 0.32.1")
    use_stores(ch, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("alerts", range="1h")
    assert not at.exception
    # the evaluator's health: the rule that failed last time, named with its error
    [failing] = [e.value for e in at.error]
    assert "team-sql/QueueSQL" in failing and "Unknown table default.queue" in failing
    groups = next(t.value for t in at.dataframe if "failing rules" in t.value.columns)
    assert dict(zip(groups["group"], groups["failing rules"], strict=True)) == {"capacity": 0, "team-sql": 1}
    assert {m.label: m.value for m in at.metric} == {
        "Firing": "2",
        "Pending": "1",
        "Active silences": "1",
        "Notifications pending or failed": "1",
    }
    tables = [t.value for t in at.dataframe]
    now_ = next(t for t in tables if "since" in t.columns)
    assert list(now_["state"]) == ["firing", "firing", "pending"]  # firing first, newest first
    assert list(now_["alert"]) == ["KVCacheSaturated", "KVCacheSaturated", "TTFTOverSLO"]
    assert "KV cache of small-1 at 95%" in set(now_["summary"])
    assert "replica=small-0, severity=page" in set(now_["labels"])
    assert list(now_["silenced"]) == [True, False, False]  # small-1 is silenced
    assert (
        now_["investigate"].iloc[2].startswith("investigate?metric=ttft&from=")
        and "model=tiny-small" in now_["investigate"].iloc[2]
    )
    resolved = next(t for t in tables if "resolved" in t.columns)
    assert list(resolved["alert"]) == ["ITLOverSLO"] and "metric=itl" in resolved["investigate"].iloc[0]
    changes = next(t for t in tables if "change" in t.columns)
    assert list(changes["change"]) == ["pending → firing", "inactive → pending"]
    [timeline] = [c for c in at.get("vega_lite_chart") if '"point"' in c.proto.spec]  # the history chart
    assert '"rule"' in timeline.proto.spec  # with the annotations, as every time chart
    assert any('alertname="KVCacheSaturated", replica="small-1"' in m.value and "ana" in m.value for m in at.markdown)
    log = next(t for t in tables if "receiver" in t.columns)
    assert list(log["receiver"]) == ["oncall-pd", "ops-slack"] and list(log["status"]) == ["failed", "delivered"]
    assert list(log["last HTTP status"]) == ["400", "200"] and "invalid routing key" in log["error"].iloc[0]
    overview = run("overview", range="1h")  # the Overview counts the same firing alerts
    assert not overview.exception
    assert {m.label: m.value for m in overview.metric}["Firing alerts"] == "2"


def test_overview_counts_firing_alerts_with_engine_metrics(shift, sessions) -> None:
    seed_alerts(shift.client, sessions)
    use_stores(shift.client, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("overview", **window(shift))
    assert not at.exception and not at.error
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Firing alerts"] == "2" and metrics["Replicas reporting"] == "3"


def test_a_silence_is_created_from_the_form_and_expired(ch, sessions) -> None:
    clickhouse_runner.apply(ch)
    use_stores(ch, sessions, load_settings(ROOT / "fleetscope.yaml", environ={}))
    at = run("alerts", range="1h")
    form = {t.key: t for t in at.text_input}
    form["silence_matchers"].input('alertname="KVCacheSaturated", replica="small-0"')
    form["silence_author"].input("ana")
    form["silence_comment"].input("driver update on small-0")
    at.selectbox(key="silence_duration").set_value("4h")
    at = at.get("form_submit_button")[0].click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    [made] = silences(sessions)
    assert [str(m) for m in made.matchers] == ['alertname="KVCacheSaturated"', 'replica="small-0"']
    assert (made.created_by, made.comment) == ("ana", "driver update on small-0")
    assert timedelta(hours=4) - timedelta(seconds=5) < made.ends_at - datetime.now(UTC) <= timedelta(hours=4)
    assert at.success and f"Silence #{made.id} created" in at.success[0].value
    assert {m.label: m.value for m in at.metric}["Active silences"] == "1"  # shown at once, not after the cache expires
    assert at.text_input(key="silence_matchers").value == ""  # the form is ready for the next one

    # a matcher that cannot be read: an error, nothing saved, what was typed stays
    at.text_input(key="silence_matchers").input('alertname="KVCacheSaturated", replica=~"small-(0"')
    at.text_input(key="silence_comment").input("typo")
    at = at.get("form_submit_button")[0].click().run()
    assert not at.exception
    assert at.error and at.error[0].value.startswith("Not saved:") and "regular expression" in at.error[0].value
    assert at.text_input(key="silence_comment").value == "typo"
    at.text_input(key="silence_matchers").input("")
    at = at.get("form_submit_button")[0].click().run()
    assert at.error and "at least one matcher" in at.error[0].value
    assert len(silences(sessions)) == 1

    at = at.button(key=f"expire_{made.id}").click().run()
    assert not at.exception and not at.error
    [ended] = silences(sessions)
    assert ended.ends_at <= datetime.now(UTC) and not ended.active(datetime.now(UTC))
    assert f"Silence #{made.id} expired." in at.success[0].value
    assert {m.label: m.value for m in at.metric}["Active silences"] == "0"
    assert not [b for b in at.button if b.key == f"expire_{made.id}"]  # listed with the ended ones, no button
    ended_table = next(t.value for t in at.dataframe if "matchers" in t.value.columns)
    assert list(ended_table["id"]) == [made.id]
