"""The ``fleetscope`` console script, run as a user runs it (a real subprocess each time)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from migrations import clickhouse_runner
from tests.conftest import ROOT, run_cli

SHIPPED_CH = [m.filename for m in clickhouse_runner.discover()]


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["version"],
        ["migrate"],
        ["config"],
        ["config", "show"],
        ["config", "check"],
        ["prices", "set"],
        ["slo", "set"],
        ["fleet", "simulate"],
        ["dashboard"],
        ["explain"],
        ["plan"],
    ],
)
def test_every_command_answers_help(command: list[str], tmp_path: Path) -> None:
    result = run_cli(*command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Usage: fleetscope" in result.stdout


def test_version(tmp_path: Path) -> None:
    result = run_cli("version", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("fleetscope 0.1.0\n")
    assert "chdb " in result.stdout


def migrate_twice(tmp_path: Path, env: dict[str, str]) -> tuple[str, str]:
    first = run_cli("migrate", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    second = run_cli("migrate", cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr
    return first.stdout, second.stdout


def test_migrate_twice_on_chdb_and_sqlite(tmp_path: Path) -> None:
    first, second = migrate_twice(tmp_path, {})
    for filename in SHIPPED_CH:
        assert f"applied {filename}" in first
    assert "applied 0001 initial metadata tables" in first
    assert (tmp_path / "data" / "clickhouse").is_dir() and (tmp_path / "data" / "metadata.db").is_file()
    assert "applied" not in second.replace("migration(s) applied", "")
    assert "nothing to apply: both stores are up to date" in second
    status = run_cli("migrate", "--status", cwd=tmp_path)
    assert "ClickHouse: 0 pending" in status.stdout and "metadata DB: 0 pending" in status.stdout


@pytest.mark.postgres
def test_migrate_twice_on_chdb_and_postgres(tmp_path: Path, pg_url: str) -> None:
    env = {"FLEETSCOPE_METADATA_URL": pg_url, "FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{tmp_path / 'ch'}"}
    first, second = migrate_twice(tmp_path, env)
    assert "metadata DB: postgresql+psycopg://postgres@127.0.0.1:5432/test" in first
    assert "applied 0001 initial metadata tables" in first
    assert "nothing to apply" in second
    assert not (tmp_path / "data" / "metadata.db").exists()


def test_bad_config_exits_2_with_one_line_and_starts_nothing(tmp_path: Path) -> None:
    (tmp_path / "fleetscope.yaml").write_text("clickhouse:\n  url: chdb:data/ch\n  connect_timeout_s: later\n")
    result = run_cli("migrate", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: fleetscope.yaml:3: clickhouse.connect_timeout_s:")
    assert not (tmp_path / "data").exists()


def test_up_refuses_a_simulated_cache_that_cannot_hold_max_model_len_with_one_line(tmp_path: Path) -> None:
    # the budget the shipped spec had before: 40 blocks of 16 tokens for a max_model_len of 2048
    (tmp_path / "fleet.yaml").write_text(
        textwrap.dedent("""
        models:
          tiny-small: {path: data/models/tiny-small}
        replicas:
          - {name: small-0, model: tiny-small, port: 18101, engine_args: {max_model_len: 2048, num_gpu_blocks_override: 40}}
        """)
    )
    result = run_cli("up", "--fleet", "sim", "--port", "18599", cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: fleet.yaml: replica 'small-0': engine_args: To serve at least one"
    )
    assert "(128 blocks of 16 tokens) KV cache is needed" in lines[0] and "at least 129" in lines[0]


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    result = run_cli("migrate", "--config", "missing.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: config file not found: missing.yaml"


def test_chdb_held_by_another_process_is_a_clear_error(tmp_path: Path) -> None:
    store = tmp_path / "ch"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time, clickhouse_connect
            c = clickhouse_connect.get_client(dsn="chdb://{store}")
            c.query("SELECT 1")
            print("ready", flush=True)
            time.sleep(60)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        result = run_cli("migrate", cwd=tmp_path, env={"FLEETSCOPE_CLICKHOUSE_URL": f"chdb:{store}"})
        assert result.returncode == 1
        assert "is held by another process" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    finally:
        holder.kill()
        holder.wait()


def test_config_show_hides_passwords(tmp_path: Path) -> None:
    env = {"FLEETSCOPE_CLICKHOUSE_URL": "https://fs:hunter2@ch.example:8443/fleet"}
    result = run_cli("config", "show", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "https://fs:***@ch.example:8443/fleet" in result.stdout
    assert "hunter2" not in result.stdout


def test_prices_and_slos_from_the_command_line(tmp_path: Path) -> None:
    listed = run_cli("prices", "list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "H100" in listed.stdout and "cpu-demo" in listed.stdout  # seeded by the migration
    assert run_cli("prices", "set", "H100", "2.25", cwd=tmp_path).returncode == 0
    assert "2.2500" in run_cli("prices", "list", cwd=tmp_path).stdout
    bad = run_cli("prices", "set", "--", "H100", "-1", cwd=tmp_path)
    assert bad.returncode == 2 and "usd_per_gpu_hour must be >= 0" in bad.stderr
    assert run_cli("slo", "set", "tiny-small", "ttft", "1.0", cwd=tmp_path).returncode == 0
    assert "tiny-small ttft p99 <= 1s" in run_cli("slo", "list", cwd=tmp_path).stdout
    wrong = run_cli("slo", "set", "tiny-small", "latency", "1.0", cwd=tmp_path)
    assert wrong.returncode == 2 and "metric must be one of" in wrong.stderr
    assert run_cli("slo", "delete", "tiny-small", "ttft", cwd=tmp_path).returncode == 0
    assert run_cli("slo", "delete", "tiny-small", "ttft", cwd=tmp_path).returncode == 2


def test_fleet_simulate_writes_a_scenario_into_the_store(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text((ROOT / "fleet.yaml").read_text())
    result = run_cli("fleet", "simulate", "--scenario", "tenant-shift", "--seed", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "request-log rows" in result.stdout and "bigcorp-onboarded" in result.stdout
    again = run_cli("fleet", "simulate", "--scenario", "no-such-scenario", cwd=tmp_path)
    assert again.returncode == 2 and "no-such-scenario" in again.stderr


def test_explain_cost_from_the_terminal_names_the_pool_the_tenant_and_the_router(tmp_path: Path) -> None:
    import json

    (tmp_path / "fleet.yaml").write_text((ROOT / "fleet.yaml").read_text())
    played = run_cli("fleet", "simulate", "--scenario", "router-shift", "--seed", "1", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    assert run_cli("migrate", cwd=tmp_path).returncode == 0  # the seeded GPU prices (cpu-demo)
    text = run_cli("explain", "--metric", "cost", "--tenant", "globex", "--since", "20m", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "Cost per 1M tokens of tenant globex rose" in text.stdout and "break at" in text.stdout
    lines = text.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("driver")) + 1 :]
    assert table[0].split()[:2] == ["volume", "tiny-small"]  # the pool that lost its tokens leads
    assert any(line.startswith("moved: tenant acme to tiny-large") and "long prompt (" in line for line in lines)
    doc = json.loads(
        run_cli(
            "explain", "--metric", "cost", "--tenant", "globex", "--since", "20m", "--format", "json", cwd=tmp_path
        ).stdout
    )
    assert doc["metric"] == "cost per 1M tokens" and doc["view"] == "tenant globex"
    assert doc["after_usd_per_million"] > 1.3 * doc["before_usd_per_million"]
    assert sum(r["usd_per_million"] for r in doc["decomposition"]) == pytest.approx(doc["change_usd_per_million"])
    assert doc["evidence"][0]["share"] >= 0.8 and doc["movers"][0]["tenant"] == "acme"
    two = run_cli("explain", "--metric", "cost", "--tenant", "acme", "--tenant", "globex", cwd=tmp_path)
    assert two.returncode == 2 and "one view" in two.stderr
    assert run_cli("explain", "--metric", "latte", cwd=tmp_path).returncode == 2


def test_explain_from_the_terminal_names_what_drove_a_simulated_rollout(tmp_path: Path) -> None:
    import json

    (tmp_path / "fleet.yaml").write_text((ROOT / "fleet.yaml").read_text())
    played = run_cli("fleet", "simulate", "--scenario", "long-context-rollout", "--seed", "3", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    text = run_cli("explain", "--since", "20m", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "p99 TTFT rose" in text.stdout and "break at" in text.stdout
    # the evidence table, ranked: the rollout's cause leads it
    table = text.stdout.split("\n\n", 1)[1].splitlines()
    assert table[0].split()[:3] == ["signal", "score", "before"]
    assert {table[1].split("  ")[0], table[2].split("  ")[0]} == {"KV-cache saturation", "long-context share"}
    data = json.loads(run_cli("explain", "--since", "20m", "--format", "json", cwd=tmp_path).stdout)
    assert data["after_s"] > 2 * data["before_s"] and data["break_at"] is not None
    assert {row["signal"] for row in data["evidence"][:2]} == {"KV-cache saturation", "long-context share"}
    # the tenant filter narrows what is read: one tenant's requests alone still show the break
    assert (
        json.loads(run_cli("explain", "--since", "20m", "--tenant", "acme", "--format", "json", cwd=tmp_path).stdout)[
            "break_at"
        ]
        is not None
    )
    for bad, message in (
        (["--latency", "ttfb"], "--latency must be one of"),
        (["--since", "soon"], "not a duration"),
        (["--start", "2026-11-30T10:00", "--end", "2026-11-30T09:00"], "the window is empty"),
    ):
        refused = run_cli("explain", *bad, cwd=tmp_path)
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr


def test_the_dashboard_refuses_an_open_address_without_a_password(tmp_path: Path) -> None:
    refused = run_cli("dashboard", "--host", "0.0.0.0", cwd=tmp_path)
    assert refused.returncode == 2
    assert "without authentication" in refused.stderr and "FLEETSCOPE_DASHBOARD_PASSWORD" in refused.stderr
    short = run_cli("dashboard", "--host", "0.0.0.0", cwd=tmp_path, env={"FLEETSCOPE_DASHBOARD_PASSWORD": "short"})
    assert short.returncode != 0 and "at least 8 characters" in short.stderr
    shown = run_cli("config", "show", cwd=tmp_path, env={"FLEETSCOPE_DASHBOARD_PASSWORD": "correct horse"})
    assert "correct horse" not in shown.stdout and "password: '**********'" in shown.stdout


def test_plan_from_the_terminal_replays_a_simulated_rollout_and_names_the_cheapest_fleet(tmp_path: Path) -> None:
    import json

    (tmp_path / "fleet.yaml").write_text((ROOT / "fleet.yaml").read_text())
    empty = run_cli("plan", "--since", "20m", cwd=tmp_path)
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1, empty.stderr
    assert "nothing to replay" in empty.stderr or "no request log" in empty.stderr
    played = run_cli("fleet", "simulate", "--scenario", "long-context-rollout", "--seed", "3", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    assert run_cli("migrate", cwd=tmp_path).returncode == 0  # the seeded GPU prices (cpu-demo)
    assert run_cli("slo", "set", "tiny-small", "ttft", "2", cwd=tmp_path).returncode == 0
    text = run_cli("plan", "--since", "20m", "--replicas", "tiny-small=2..4", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert any(line.startswith("backtest") for line in lines)
    assert any("recorded (observed)" in line for line in lines) and any("tiny-small=4" in line for line in lines)
    assert lines[-1].startswith(("cheapest meeting every SLO: tiny-small=", "no fleet replayed meets every SLO"))
    doc = json.loads(
        run_cli("plan", "--since", "20m", "--replicas", "tiny-small=2,4", "--format", "json", cwd=tmp_path).stdout
    )
    fleets = {row["fleet"]: row for row in doc["fleets"]}
    four = next(name for name in fleets if name.startswith("tiny-small=4"))
    assert fleets[four]["spend_per_hour"] > fleets["recorded (replayed)"]["spend_per_hour"]
    assert fleets[four]["p99_ttft tiny-small"] < fleets["recorded (replayed)"]["p99_ttft tiny-small"]
    assert {row["model"] for row in doc["backtest"]} >= {"tiny-small", "tiny-large"}
    for bad, message in (
        (["--replicas", "tiny-huge=2"], "unknown model 'tiny-huge'"),
        (["--gpu", "tiny-small=B300"], "unknown GPU type 'B300'"),
        (["--replicas", "tiny-small=two"], "--replicas"),
        (["--start", "2020-01-01T00:00", "--end", "2020-01-01T00:30"], "no request log between"),
    ):
        result = run_cli("plan", "--since", "20m", *bad, cwd=tmp_path)
        assert result.returncode == 2 and message in result.stderr, (bad, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
