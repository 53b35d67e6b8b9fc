-- Counter increases stored per sample and summed per rollup bucket, so that a counter's (or a
-- histogram bucket's) increase over any run of buckets is a sum: no window function over the
-- series, no look back for the value before the window (a 30-day Overview spent most of its
-- time there). The collector writes `samples.increase`: a cumulative series' increase since its
-- previous sample (its value after a reset: the counter counts from zero), 0 for a series' first
-- sample, for NaN values and for gauges. The rollups sum it per bucket (`increase`), so a bucket
-- holds the increase from the sample before its first one to its last one, and the buckets of a
-- window add up to the window's increase (analytics.metrics, analytics.timeseries). Raw-tier
-- queries still read the values (samples written before this migration have 0 here).
--
-- Migrate while the collectors are stopped: each view is dropped and created again with the new
-- column (an insert in between would reach the raw table and not the rollups), and the history
-- is filled in below from the buckets already rolled up.

ALTER TABLE {{local:samples}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS increase Float64 DEFAULT 0 CODEC(ZSTD(1))
    COMMENT 'cumulative series: the increase since its previous sample (reset-aware); 0 for its first sample, NaN values and gauges';

ALTER TABLE samples {{on_cluster}} ADD COLUMN IF NOT EXISTS increase Float64 DEFAULT 0;

ALTER TABLE {{local:samples_1m}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS increase SimpleAggregateFunction(sum, Float64) DEFAULT 0
    COMMENT 'cumulative series: sum of samples.increase in the bucket (from the sample before it to its last one)';
ALTER TABLE samples_1m {{on_cluster}} ADD COLUMN IF NOT EXISTS increase SimpleAggregateFunction(sum, Float64) DEFAULT 0;
ALTER TABLE {{local:samples_1h}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS increase SimpleAggregateFunction(sum, Float64) DEFAULT 0
    COMMENT 'cumulative series: sum of samples.increase in the bucket (from the sample before it to its last one)';
ALTER TABLE samples_1h {{on_cluster}} ADD COLUMN IF NOT EXISTS increase SimpleAggregateFunction(sum, Float64) DEFAULT 0;
ALTER TABLE {{local:samples_6h}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS increase SimpleAggregateFunction(sum, Float64) DEFAULT 0
    COMMENT 'cumulative series: sum of samples.increase in the bucket (from the sample before it to its last one)';
ALTER TABLE samples_6h {{on_cluster}} ADD COLUMN IF NOT EXISTS increase SimpleAggregateFunction(sum, Float64) DEFAULT 0;

DROP VIEW IF EXISTS samples_1m_mv {{on_cluster}};

CREATE MATERIALIZED VIEW IF NOT EXISTS samples_1m_mv {{on_cluster}} TO {{local:samples_1m}} AS
SELECT
    metric,
    fingerprint,
    toStartOfMinute(raw_ts) AS ts,
    sum(reset) AS resets,
    min(if(isFinite(value), value, inf)) AS value_min,
    max(if(isFinite(value), value, -inf)) AS value_max,
    sumIf(value, isFinite(value)) AS value_sum,
    countIf(isFinite(value)) AS value_count,
    min(if(isNaN(value), (toDateTime64('2200-01-01 00:00:00', 3, 'UTC'), value, reset), (raw_ts, value, reset))) AS value_first,
    max(if(isNaN(value), (toDateTime64(0, 3, 'UTC'), value), (raw_ts, value))) AS value_last,
    sum(increase) AS increase
FROM (SELECT metric, fingerprint, ts AS raw_ts, value, reset, increase FROM {{local:samples}})
GROUP BY metric, fingerprint, ts;

DROP VIEW IF EXISTS samples_1h_mv {{on_cluster}};

CREATE MATERIALIZED VIEW IF NOT EXISTS samples_1h_mv {{on_cluster}} TO {{local:samples_1h}} AS
SELECT
    metric,
    fingerprint,
    toStartOfHour(raw_ts) AS ts,
    sum(reset) AS resets,
    min(if(isFinite(value), value, inf)) AS value_min,
    max(if(isFinite(value), value, -inf)) AS value_max,
    sumIf(value, isFinite(value)) AS value_sum,
    countIf(isFinite(value)) AS value_count,
    min(if(isNaN(value), (toDateTime64('2200-01-01 00:00:00', 3, 'UTC'), value, reset), (raw_ts, value, reset))) AS value_first,
    max(if(isNaN(value), (toDateTime64(0, 3, 'UTC'), value), (raw_ts, value))) AS value_last,
    sum(increase) AS increase
FROM (SELECT metric, fingerprint, ts AS raw_ts, value, reset, increase FROM {{local:samples}})
GROUP BY metric, fingerprint, ts;

DROP VIEW IF EXISTS samples_6h_mv {{on_cluster}};

CREATE MATERIALIZED VIEW IF NOT EXISTS samples_6h_mv {{on_cluster}} TO {{local:samples_6h}} AS
SELECT
    metric,
    fingerprint,
    toStartOfInterval(hour_ts, INTERVAL 6 HOUR) AS ts,
    sum(resets) AS resets,
    min(value_min) AS value_min,
    max(value_max) AS value_max,
    sum(value_sum) AS value_sum,
    sum(value_count) AS value_count,
    min(value_first) AS value_first,
    max(value_last) AS value_last,
    sum(increase) AS increase
FROM (SELECT metric, fingerprint, ts AS hour_ts, resets, value_min, value_max, value_sum, value_count, value_first,
             value_last, increase FROM {{local:samples_1h}})
GROUP BY metric, fingerprint, ts;

-- The history: each bucket rolled up before this migration gets its increase, computed once as
-- the queries did until now (its last value less the previous bucket's, plus the resets in it; a
-- series' first bucket from its own first value; a drop nobody marked counts from zero), for the
-- cumulative series (named *_total, *_bucket, *_count, *_sum: the rollups keep no types). It is
-- written as rows that carry only the increase (the other columns at their aggregates' neutral
-- values: inf, -inf, 0, and first/last tuples no real sample beats), which the table's merges
-- add to the bucket. Buckets that already have an increase are left alone, so a migration run
-- again after an interruption adds nothing twice. The 1-hour rows reach the 6-hour rollup
-- through its view, as every insert into samples_1h does.
INSERT INTO samples_1m (metric, fingerprint, ts, resets, value_min, value_max, value_sum, value_count, value_first, value_last, increase)
SELECT metric, fingerprint, ts, 0, inf, -inf, 0, 0,
       (toDateTime64('2200-01-01 00:00:00', 3, 'UTC'), nan, 0), (toDateTime64(0, 3, 'UTC'), nan), added
FROM (
    SELECT metric, fingerprint, ts, stored,
           lagInFrame(last_v, 1, nan) OVER (PARTITION BY metric, fingerprint ORDER BY ts ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS prev,
           if(isNaN(prev), last_v - first_v + resets - first_reset, last_v - prev + resets) AS marked,
           if(marked < 0, last_v + resets, marked) AS added
    FROM (
        SELECT metric, fingerprint, ts, argMax(value_last.2, value_last.1) AS last_v,
               argMin(value_first.2, value_first.1) AS first_v, argMin(value_first.3, value_first.1) AS first_reset,
               sum(resets) AS resets, sum(increase) AS stored
        FROM samples_1m
        WHERE match(metric, '_(total|bucket|count|sum)$')
        GROUP BY metric, fingerprint, ts
        HAVING NOT isNaN(last_v)
    )
)
WHERE stored = 0 AND added != 0 AND isFinite(added)
SETTINGS max_bytes_before_external_group_by = 2000000000, max_bytes_before_external_sort = 2000000000;

INSERT INTO samples_1h (metric, fingerprint, ts, resets, value_min, value_max, value_sum, value_count, value_first, value_last, increase)
SELECT metric, fingerprint, ts, 0, inf, -inf, 0, 0,
       (toDateTime64('2200-01-01 00:00:00', 3, 'UTC'), nan, 0), (toDateTime64(0, 3, 'UTC'), nan), added
FROM (
    SELECT metric, fingerprint, ts, stored,
           lagInFrame(last_v, 1, nan) OVER (PARTITION BY metric, fingerprint ORDER BY ts ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) AS prev,
           if(isNaN(prev), last_v - first_v + resets - first_reset, last_v - prev + resets) AS marked,
           if(marked < 0, last_v + resets, marked) AS added
    FROM (
        SELECT metric, fingerprint, ts, argMax(value_last.2, value_last.1) AS last_v,
               argMin(value_first.2, value_first.1) AS first_v, argMin(value_first.3, value_first.1) AS first_reset,
               sum(resets) AS resets, sum(increase) AS stored
        FROM samples_1h
        WHERE match(metric, '_(total|bucket|count|sum)$')
        GROUP BY metric, fingerprint, ts
        HAVING NOT isNaN(last_v)
    )
)
WHERE stored = 0 AND added != 0 AND isFinite(added)
SETTINGS max_bytes_before_external_group_by = 2000000000, max_bytes_before_external_sort = 2000000000;
