"""Benchmark: inserting scraped samples into the real `samples` table on chDB.

Compares, side by side in one run, a columnar DataFrame insert (``insert_df``, what the
writer uses) with the row-tuple insert (``insert``, the reference), on the same rows.
Prints rows/s for both and the ratio. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from migrations import clickhouse_runner
from storage.clickhouse import connect


def make_rows(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    start = datetime(2026, 11, 29, tzinfo=UTC)
    return pd.DataFrame(
        {
            "metric": rng.choice(
                ["vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket"], n
            ),
            "fingerprint": rng.integers(0, 2**63, n, dtype=np.uint64),
            "ts": [start + timedelta(milliseconds=5000 * (i // 430)) for i in range(n)],
            "value": rng.random(n),
        }
    )


def best_of(repeats: int, fn) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        client = connect(f"chdb:{tmp}/ch")
        clickhouse_runner.apply(client)
        df = make_rows(args.rows)
        rows = df.to_numpy().tolist()
        columns = list(df.columns)
        columnar = best_of(args.repeats, lambda: client.insert_df("samples_ingest", df))  # where the collector inserts
        row_wise = best_of(args.repeats, lambda: client.insert("samples_ingest", rows, column_names=columns))
        client.close()
    print(f"rows per insert:                 {args.rows:,}")
    print(f"insert_df (columnar, ours):      {args.rows / columnar:,.0f} rows/s")
    print(f"insert (row tuples, reference):  {args.rows / row_wise:,.0f} rows/s")
    print(f"ratio columnar / row tuples:     {row_wise / columnar:.1f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "rows": args.rows,
                    "insert_df_rows_per_s": args.rows / columnar,
                    "row_tuples_rows_per_s": args.rows / row_wise,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
