"""Rule files and rule tests: line-numbered errors, expressions, templates, promtool's value
notation, and ``fleetscope alerts check|test`` run as a user runs them (the built-in pack's own
tests included)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from alerts.expr import parse_expr
from alerts.rules import PACK, load_rules, parse_duration, render
from alerts.signals import SIGNALS
from common.yamlfile import YamlConfigError
from fleetscope.ruletest import expand_values
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
groups:
  - name: capacity
    interval: 30s
    rules:
      - name: KVFull
        expr: kv_cache_usage_max{window="2m", model=~"tiny-.*"}
        op: ">="
        threshold: 90%
        for: 5m
        labels: {severity: page}
        annotations: {summary: "{{ $labels.replica }} at {{ $value | percent }}"}
"""


def write(tmp_path: Path, text: str, name: str = "rules.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_file_reads_with_durations_matchers_and_percent_thresholds(tmp_path: Path) -> None:
    (group,) = load_rules(write(tmp_path, GOOD)).groups
    rule = group.rules[0]
    assert group.interval_s == 30 and rule.for_s == 300 and rule.threshold == 0.9
    assert rule.parsed.signal == "kv_cache_usage_max" and rule.parsed.kwargs == {"window": 120.0, "by": "replica"}
    assert [str(m) for m in rule.parsed.matchers] == ['model=~"tiny-.*"']
    assert rule.holds(0.9) and not rule.holds(0.89) and not rule.holds(float("nan"))


@pytest.mark.parametrize(
    "change, line, says",
    [
        (("for: 5m", "for: 5 minutes"), 9, "for: not a duration: '5 minutes'"),
        (('op: ">="', 'op: "=>"'), 7, "op: Input should be"),
        (("expr: kv_cache_usage_max", "expr: kv_cache_usage_maxx"), 5, "did you mean 'kv_cache_usage_max'"),
        (('window="2m"', 'window="soon"'), 5, "kv_cache_usage_max: window: not a duration"),
        (("labels: {severity: page}", "labels: {severity: page, 2x: y}"), 10, "label name '2x'"),
        (("$value | percent", "$value | money"), 11, "unknown template field"),
        (("threshold: 90%", "treshold: 90%"), 8, "unknown key (did you mean 'threshold'?)"),
        (("interval: 30s", "interval: 0s"), 3, "interval must be at least 1s"),
    ],
)
def test_each_mistake_is_one_line_naming_file_line_and_key(
    tmp_path: Path, change: tuple[str, str], line: int, says: str
) -> None:
    path = write(tmp_path, GOOD.replace(*change))
    with pytest.raises(YamlConfigError) as err:
        load_rules(path)
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert says in message and "\n" not in message


def test_duplicate_rules_and_groups_are_refused(tmp_path: Path) -> None:
    rule = GOOD.split("    rules:\n")[1]
    with pytest.raises(YamlConfigError, match="rule 'KVFull' appears twice"):
        load_rules(write(tmp_path, GOOD + rule))


def test_sql_expressions_and_signal_parameters() -> None:
    assert parse_expr("SELECT replica, max(x) AS value FROM t GROUP BY replica").signal is None
    # a rule's SQL passes ad-hoc SQL's statement check: one read-only SELECT of this store
    with pytest.raises(ValueError, match=r"the rule's SQL is refused: file\(\) reaches files"):
        parse_expr("SELECT file('/etc/passwd') AS value")
    with pytest.raises(ValueError, match="refused"):
        parse_expr("SELECT 1 AS value SETTINGS readonly = 0")
    burn = parse_expr('slo_burn_rate{window="6h", short="30m"}')
    assert burn.kwargs["window"] == 6 * 3600 and burn.kwargs["short"] == 1800
    with pytest.raises(ValueError, match="by must be one of replica, model"):
        parse_expr('kv_cache_usage_max{by="tenant"}')
    with pytest.raises(ValueError, match="window takes =, not =~"):
        parse_expr('kv_cache_usage_max{window=~"1m"}')
    assert {
        "replica_up",
        "kv_cache_usage_max",
        "preemption_rate",
        "error_ratio",
        "slo_burn_rate",
        "cost_per_mtok",
        "drift_share",
        "ttft_p99",
        "itl_p99",
    } <= set(SIGNALS)


def test_templates_fill_labels_and_formatted_values() -> None:
    labels = {"alertname": "KVFull", "replica": "small-0", "model": "tiny"}
    assert render("{{ $labels.replica }} at {{ $value | percent }}", labels, 0.934) == "small-0 at 93%"
    assert render("p99 {{ $value | seconds }}", labels, 2.5) == "p99 2.5 s"
    assert render("{{ $labels }}", labels, 1) == "model=tiny, replica=small-0"
    assert render("{{ $value }}", labels, None) == "n/a"


def test_durations_and_promtool_value_notation() -> None:
    assert parse_duration("1h30m") == 5400 and parse_duration("250ms") == 0.25 and parse_duration(0) == 0
    assert expand_values("1+2x3 _ 5x2 _x1 10-1x2") == [1, 3, 5, 7, None, 5, 5, 5, None, None, 10, 9, 8]
    with pytest.raises(ValueError, match="cannot read 'x3'"):
        expand_values("1 x3")


def test_alerts_check_validates_the_configured_rules_and_files(tmp_path: Path) -> None:
    done = run_cli("alerts", "check", cwd=tmp_path)
    groups = yaml.safe_load(PACK.read_text())["groups"]  # the built-in pack, every rule counted
    want = f"{len(groups)} group(s), {sum(len(g['rules']) for g in groups)} rule(s)"
    assert done.returncode == 0 and want in done.stdout, (want, done.stdout, done.stderr)
    bad = write(tmp_path, GOOD.replace("for: 5m", "for: soon"))
    done = run_cli("alerts", "check", str(bad), cwd=tmp_path)
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"error: {bad}:9: groups.0.rules.0.for: not a duration: 'soon' (write e.g. 30s, 5m, 1h30m, 3d)"
    )


def test_the_built_in_pack_passes_its_own_rule_tests_and_a_wrong_expectation_fails(tmp_path: Path) -> None:
    tests = PACK.with_name("builtin_test.yaml")
    cases = len(yaml.safe_load(tests.read_text())["tests"])
    done = run_cli("alerts", "test", str(tests), cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{cases} passed, 0 failed" in done.stdout and done.stdout.count("PASS ") == cases

    wrong = write(
        tmp_path,
        f"""\
rule_files: [{PACK}]
tests:
  - name: expects r2 instead of r1
    interval: 5s
    input_series:
      - series: 'vllm:kv_cache_usage_perc{{replica="r1", model_name="tiny"}}'
        values: '0.95x80'
    alert_rule_test:
      - eval_time: 6m
        alertname: KVCacheSaturated
        exp_alerts:
          - exp_labels: {{replica: r2, severity: page, team: inference}}
""",
        "wrong_test.yaml",
    )
    done = run_cli("alerts", "test", str(wrong), cwd=tmp_path, timeout=300)
    assert done.returncode == 1
    assert "FAIL" in done.stdout and "expects r2 instead of r1" in done.stdout
    assert (
        'expected firing [\'{replica="r2", severity="page", team="inference"}\'], got [\'{replica="r1"' in done.stdout
    )
