"""Rule unit tests in the style of ``promtool test rules``: YAML cases -> pass/fail per case.

In:  a test file::

        rule_files: [builtin]            # "builtin" is the shipped pack; else paths next to this file
        evaluation_interval: 15s
        tests:
          - name: a saturated cache pages after 5 minutes
            interval: 5s                 # the input series' scrape interval
            input_series:
              - series: 'vllm:kv_cache_usage_perc{replica="r1", model_name="m"}'
                values: '0.5x20 0.95x100'        # a+bxn, axn, _ (missing), _xn
              - series: 'up{replica="r2"}'        # 0: that target's scrape failed
                values: '1x10 0x50'
            slo_targets:                 # optional, for latency_over_slo / slo_burn_rate
              - {model: m, metric: ttft, threshold_seconds: 2.0, objective: 0.99}
            gpu_prices: {H100: 2.99}     # optional, over the seeded prices (cost rules)
            evaluate_from: 7d            # optional: a long history is evaluated from here on
            alert_rule_test:
              - eval_time: 8m
                alertname: KVCacheSaturated
                exp_alerts:
                  - exp_labels: {replica: r1, severity: page, team: inference}
                    exp_annotations: {summary: "..."}

     and a ClickHouse client factory (a throwaway chDB database per case) and a metadata URL
     factory (a throwaway SQLite file per case).
Out: ``CaseResult`` per case with the failures in words. The input series go through the
     collector's own parser, converter and writer (one scrape per target and interval: targets
     are told apart by their ``replica``, ``instance`` and ``job`` labels); then every rule group
     is evaluated by ``alerts.evaluator`` on its own ``interval`` (``evaluation_interval`` for a
     group without one) from the first sample to the last ``eval_time``, as a running evaluator
     would have, and at every ``eval_time``. At each ``eval_time`` the
     *firing* alerts of ``alertname`` must be exactly ``exp_alerts``: the same label sets
     (``alertname`` left out), and the annotations named must be equal.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from alerts.rules import PACK, RuleFile, RuleGroup, load_rules, merge
from common.durations import Duration
from common.yamlfile import YamlConfigError, describe_validation_error, read_yaml

__all__ = ["CaseResult", "expand_values", "load_tests", "run_tests"]

_TERM = re.compile(r"^(_|stale|-?[0-9.eE+-]+?)(?:([+-])([0-9.eE]+))?(?:x(\d+))?$")
_SERIES = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def expand_values(text: str) -> list[float | None]:
    """promtool's notation: ``1+2x3`` -> 1 3 5 7, ``5x2`` -> 5 5 5, ``_x2`` -> 3 gaps, ``1 _ 3``."""
    out: list[float | None] = []
    for term in str(text).split():
        m = _TERM.match(term)
        if not m:
            raise ValueError(f"cannot read {term!r}: write a, a+bxn, a-bxn, axn, _ or _xn")
        start, sign, step, times = m.groups()
        n = int(times) if times is not None else 0
        if start in ("_", "stale"):
            if sign:
                raise ValueError(f"{term!r}: a gap has no increment")
            out.extend([None] * (n + 1 if times is not None else 1))
            continue
        try:
            a = float(start)
            b = float(step) * (-1 if sign == "-" else 1) if sign else 0.0
        except ValueError:
            raise ValueError(f"cannot read {term!r}: not a number") from None
        if times is None:
            out.append(a)
        else:
            out.extend(a + b * i for i in range(n + 1))
    return out


def parse_series(text: str) -> tuple[str, dict[str, str]]:
    m = _SERIES.match(text)
    if not m:
        raise ValueError(f'cannot read series {text!r}: write name{{label="value", ...}}')
    labels: dict[str, str] = {}
    inner = (m.group(2) or "").strip()
    pos = 0
    while pos < len(inner):
        lm = _LABEL.match(inner, pos)
        if not lm:
            raise ValueError(f"cannot read the labels of {text!r} at {inner[pos:][:20]!r}")
        labels[lm.group(1)] = re.sub(r"\\(.)", r"\1", lm.group(2))
        pos = lm.end()
    return m.group(1), labels


class InputSeries(BaseModel):
    model_config = ConfigDict(extra="forbid")
    series: str
    values: str

    @field_validator("series")
    @classmethod
    def _series(cls, v: str) -> str:
        parse_series(v)
        return v

    @field_validator("values", mode="before")
    @classmethod
    def _values(cls, v: object) -> str:
        expand_values(str(v))
        return str(v)


class ExpAlert(BaseModel):
    model_config = ConfigDict(extra="forbid")
    exp_labels: dict[str, str] = Field(default_factory=dict)
    exp_annotations: dict[str, str] = Field(default_factory=dict)


class AlertTest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    eval_time_s: Duration = Field(alias="eval_time")
    alertname: str
    exp_alerts: list[ExpAlert] = Field(default_factory=list)


class SloInput(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    metric: str
    threshold_seconds: float
    objective: float = 0.99
    percentile: float | None = None
    window_days: int = 30


class Case(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = ""
    interval_s: Duration = Field(default=5.0, alias="interval")
    input_series: list[InputSeries] = Field(default_factory=list)
    slo_targets: list[SloInput] = Field(default_factory=list)
    # USD per GPU-hour by gpu_type, over the seeded ones (cost rules read the replicas' gpu_type label)
    gpu_prices: dict[str, float] = Field(default_factory=dict)
    # a long history (a week for a week-over-week rule) is evaluated only from here on, as an
    # evaluator started then would (a rule's for: must fit after it)
    evaluate_from_s: Duration = Field(default=0.0, alias="evaluate_from")
    alert_rule_test: list[AlertTest] = Field(min_length=1)


class TestFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rule_files: list[str] = Field(min_length=1)
    evaluation_interval_s: Duration = Field(default=15.0, alias="evaluation_interval")
    tests: list[Case] = Field(min_length=1)


@dataclass
class CaseResult:
    name: str
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def load_tests(path: Path) -> tuple[TestFile, list[RuleFile]]:
    data, lines = read_yaml(Path(path), "rule test file")
    try:
        spec = TestFile.model_validate(data)
    except ValidationError as exc:
        raise YamlConfigError(describe_validation_error(exc, TestFile, str(path), lines)) from None
    files = [load_rules(PACK if f == "builtin" else (Path(path).parent / f)) for f in spec.rule_files]
    return spec, files


def run_tests(
    path: Path,
    client_factory: Callable[[], Any],
    metadata_url_factory: Callable[[], str] | None = None,
    progress: Callable[[str], None] = lambda _m: None,
) -> list[CaseResult]:
    """Run every case of the test file ``path``; each case gets a fresh store."""
    spec, files = load_tests(path)
    groups = merge(files)
    results = []
    for i, case in enumerate(spec.tests):
        name = case.name or f"case {i + 1}"
        progress(f"{name} ...")
        with tempfile.TemporaryDirectory(prefix="fleetscope-ruletest-") as tmp:
            url = metadata_url_factory() if metadata_url_factory else f"sqlite:///{tmp}/metadata.db"
            try:
                results.append(
                    _run_case(name, case, groups, spec.evaluation_interval_s, client_factory(), url, Path(tmp))
                )
            except ValueError as exc:
                results.append(CaseResult(name, [str(exc)]))
    return results


def _run_case(
    name: str, case: Case, groups: list[RuleGroup], every_s: float, client: Any, url: str, tmp: Path
) -> CaseResult:
    from alerts.config import AlertsSettings
    from alerts.evaluator import Evaluator
    from alerts.reading import Context
    from migrations import metadata_runner
    from storage.catalog import SloTarget, set_gpu_price, set_slo
    from storage.metadata import make_engine, make_sessionmaker

    result = CaseResult(name)
    # only the groups whose rules the case checks: groups are evaluated independently, so the
    # others cannot change what these do (and a week of history stays quick)
    asked = {t.alertname for t in case.alert_rule_test}
    groups = [g for g in groups if any(r.name in asked for r in g.rules)]
    last = max(t.eval_time_s for t in case.alert_rule_test)
    t0 = (datetime.now(UTC) - timedelta(seconds=last) - timedelta(hours=1)).replace(second=0, microsecond=0)
    _load_series(client, case, t0, last, tmp)
    list(metadata_runner.upgrade(url))
    sessions = make_sessionmaker(make_engine(url))
    for gpu_type, price in case.gpu_prices.items():
        set_gpu_price(sessions, gpu_type, price)
    for t in case.slo_targets:
        set_slo(
            sessions,
            SloTarget(
                model=t.model,
                metric=t.metric,
                threshold_seconds=t.threshold_seconds,
                objective=t.objective,
                percentile=t.percentile,
                window_days=t.window_days,
            ),
        )
    evaluator = Evaluator(
        groups, Context(client, sessions), sessions, AlertsSettings(builtin_rules=False, inhibit_rules=[])
    )
    checks = sorted(case.alert_rule_test, key=lambda t: t.eval_time_s)
    # each group on its own interval (the file's evaluation_interval where a group sets none), as
    # a running evaluator does; and every group at each eval_time, so the check sees that moment
    intervals = {g.name: g.interval_s if "interval_s" in g.model_fields_set else every_s for g in groups}
    times = sorted(
        {i * every_s for i in range(int(last // every_s) + 1) if i * every_s >= case.evaluate_from_s}
        | {t.eval_time_s for t in checks}
    )
    pending = list(checks)
    for offset in times:
        at = t0 + timedelta(seconds=offset)
        for g in groups:
            if offset % intervals[g.name] < 1e-9 or any(abs(c.eval_time_s - offset) < 1e-9 for c in checks):
                evaluator.evaluate_group(g, at)
        while pending and pending[0].eval_time_s <= offset:
            check = pending.pop(0)
            result.failures.extend(_compare(check, evaluator))
    return result


def _compare(check: AlertTest, evaluator: Any) -> list[str]:
    got = [inst for inst in evaluator.states.get(check.alertname, {}).values() if inst.state == "firing"]
    if check.alertname not in {r.name for g in evaluator.groups for r in g.rules}:
        return [f"at {check.eval_time_s:g}s: no rule named {check.alertname!r} in the rule files"]
    want = [{k: v for k, v in e.exp_labels.items() if k != "alertname"} for e in check.exp_alerts]
    have = [{k: v for k, v in inst.labels.items() if k != "alertname"} for inst in got]
    failures = []
    if sorted(map(_text, want)) != sorted(map(_text, have)):
        failures.append(
            f"at {_dur(check.eval_time_s)}: {check.alertname}: expected firing "
            f"{[_text(w) for w in want] or 'none'}, got {[_text(h) for h in have] or 'none'}"
        )
        return failures
    for exp in check.exp_alerts:
        labels = {k: v for k, v in exp.exp_labels.items() if k != "alertname"}
        inst = next(i for i in got if {k: v for k, v in i.labels.items() if k != "alertname"} == labels)
        for key, text in exp.exp_annotations.items():
            if inst.annotations.get(key) != text:
                failures.append(
                    f"at {_dur(check.eval_time_s)}: {check.alertname} {_text(labels)}: annotation "
                    f"{key}: expected {text!r}, got {inst.annotations.get(key)!r}"
                )
    return failures


def _text(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _dur(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s" if seconds >= 60 else f"{seconds:g}s"


def _kind(name: str) -> str:
    if name.endswith("_total"):
        return "counter"
    if name.endswith(("_bucket", "_sum", "_count")):
        return "histogram"
    return "gauge"


def _load_series(client: Any, case: Case, t0: datetime, last_s: float, tmp: Path) -> None:
    """Write the input series the way the collector writes scrapes (parser, converter, writer)."""
    from collector.convert import Batch, SeriesConverter
    from collector.exposition import SeriesCache, parse
    from collector.scrape import ScrapeResult
    from collector.targets import make_target
    from collector.writer import Writer, WriterConfig

    targets: dict[tuple[str, str, str], dict[str, Any]] = {}
    for s in case.input_series:
        metric, labels = parse_series(s.series)
        job, replica = labels.pop("job", "vllm"), labels.pop("replica", "")
        instance = labels.pop("instance", "")
        key = (job, instance, replica)
        t = targets.setdefault(key, {"series": [], "up": None})
        if metric == "up":
            t["up"] = expand_values(s.values)
        else:
            t["series"].append((metric, labels, expand_values(s.values)))
    writer = Writer(client, WriterConfig(spool_dir=tmp / "spool"))
    steps = int(last_s // case.interval_s) + 1
    for n, ((job, instance, replica), spec) in enumerate(sorted(targets.items())):
        target = make_target(
            instance or f"127.0.0.1:{9000 + n}",
            job=job,
            interval_s=case.interval_s,
            timeout_s=case.interval_s,
            labels={"replica": replica} if replica else {},
        )
        converter, cache = SeriesConverter(), SeriesCache()
        lengths = [len(v) for _, _, v in spec["series"]] + ([len(spec["up"])] if spec["up"] else [])
        for i in range(min(steps, max(lengths, default=0))):
            ts = t0.timestamp() + i * case.interval_s
            up = spec["up"][i] if spec["up"] is not None and i < len(spec["up"]) else 1.0
            if up is None:
                continue  # no scrape at all at this step
            batch = Batch()
            if not up:
                converter.convert(
                    ScrapeResult(target, ts, False, 0.01, 0, "connection refused (rule test input)", None), batch
                )
            else:
                lines, typed = [], set()
                for metric, labels, values in sorted(
                    spec["series"], key=lambda x: re.sub(r"_(bucket|sum|count)$", "", x[0])
                ):
                    if i >= len(values) or values[i] is None:
                        continue
                    family = re.sub(r"_(bucket|sum|count)$", "", metric) if _kind(metric) == "histogram" else metric
                    if family not in typed:
                        typed.add(family)
                        lines.append(f"# TYPE {family} {_kind(metric)}")
                    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                    lines.append(f"{metric}{{{inner}}} {values[i]!r}" if inner else f"{metric} {values[i]!r}")
                exposition = parse("\n".join(lines) + "\n", cache=cache)
                converter.convert(ScrapeResult(target, ts, True, 0.01, len(exposition), "", exposition), batch)
            writer.add_tables(batch.tables)
    if not writer.flush():
        raise ValueError("could not write the input series into the throwaway store")
