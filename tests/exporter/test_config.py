"""The ``exporter`` settings: defaults, durations as people write them, one-line errors naming
the key, and ``exporter.enabled: false`` leaving the collector's /metrics to its own metrics."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from collector.service import Collector, CollectorConfig
from collector.writer import Writer, WriterConfig
from fleetscope.collect import mount_exporter
from fleetscope.settings import SettingsError, load_settings


def settings_from(tmp_path: Path, text: str, environ: dict[str, str] | None = None):
    path = tmp_path / "fleetscope.yaml"
    path.write_text(text)
    return load_settings(path, environ or {})


def test_defaults_and_durations(tmp_path: Path) -> None:
    assert settings_from(tmp_path, "{}\n").exporter.params().window == timedelta(hours=1)
    s = settings_from(
        tmp_path, "exporter:\n  interval_s: 1m\n  window_s: 6h\n  recent_window_s: 5m\ncost:\n  output_weight: 2\n"
    )
    assert (s.exporter.enabled, s.exporter.interval_s) == (True, 60.0)
    params = s.exporter.params(s.cost.weights())
    assert (params.window, params.recent, params.weights.output) == (timedelta(hours=6), timedelta(minutes=5), 2.0)
    s = settings_from(tmp_path, "{}\n", {"FLEETSCOPE_EXPORTER_WINDOW_S": "2h", "FLEETSCOPE_EXPORTER_ENABLED": "false"})
    assert (s.exporter.window_s, s.exporter.enabled) == (7200.0, False)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (
            "exporter:\n  interval_s: 0.5\n",
            "fleetscope.yaml:2: exporter.interval_s: must be between 1s and 1h (e.g. 30s), not 0.5 s",
        ),
        (
            "exporter:\n  window_s: 10s\n",
            "fleetscope.yaml:2: exporter.window_s: must be between 1m and 30d (e.g. 1h), not 10 s",
        ),
        ("exporter:\n  window_s: soon\n", "exporter.window_s: not a duration: 'soon' (write e.g. 30s, 5m, 1h30m, 3d)"),
        ("exporter:\n  window_s: 5m\n", "exporter: recent_window_s (600 s) must not be longer than window_s (300 s)"),
        ("exporter:\n  interval: 5s\n", "exporter.interval: unknown key (did you mean 'interval_s'?)"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_key(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(SettingsError) as caught:
        settings_from(tmp_path, text)
    assert said in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("exporter:\n  enabled: false\n", "fleetscope's numbers are not on /metrics (exporter.enabled: false)"),
        (
            "collector:\n  shard_count: 3\n  shard_index: 1\n",
            "fleetscope's numbers are on shard 0's /metrics (this is shard 1 of 3)",
        ),
    ],
)
def test_disabled_or_another_shard_leaves_metrics_to_the_collector(tmp_path: Path, ch, text: str, said: str) -> None:
    settings = settings_from(tmp_path, text)
    collector = Collector(CollectorConfig(), Writer(ch, WriterConfig(spool_dir=tmp_path / "spool")))
    assert mount_exporter(settings, collector) == said
    assert not collector.mounts
    body = generate_latest(collector.registry).decode()
    assert "fleetscope_collector_" in body and "fleetscope_exporter_" not in body
