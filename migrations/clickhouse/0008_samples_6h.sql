-- A 6-hour rollup of the samples for long windows (a 30-day view reads 120 rows per series
-- instead of 720): analytics/tiers.py picks it for windows longer than `hour_max_span_days`.
-- It is fed from the 1-hour rollup (a cascade: an insert into samples_1h, from its view on the
-- raw samples or written directly by `fleetscope bench seed`, reaches it too); the columns are
-- aggregate states that compose (min, max, sums, the first and last (time, value) tuples), so
-- it is exact, as if rolled up from the raw samples. The request log has no 6-hour tier: its
-- 1-hour rollup is small. Retention follows `hour_days` (storage/retention.py).

CREATE TABLE IF NOT EXISTS {{local:samples_6h}} {{on_cluster}} AS {{local:samples_1m}}
ENGINE = {{engine:AggregatingMergeTree}}
PARTITION BY toYYYYMM(ts)
ORDER BY (metric, fingerprint, ts)
SETTINGS ttl_only_drop_parts = 1
COMMENT 'Samples rolled up per series and 6 hours (from samples_1h, by samples_6h_mv)';

ALTER TABLE {{local:samples_6h}} {{on_cluster}} COMMENT COLUMN ts 'start of the 6 hours (00, 06, 12, 18 UTC)';

{{distributed:samples_6h:fingerprint}};

-- The history the 1-hour rollup already holds, before the view below takes what comes next
-- (emptied first, so that a migration interrupted after this insert and run again does not
-- count the history twice; on a cluster, rows inserted while this runs may be counted twice
-- or not at all for their 6 hours: migrate while the collectors are stopped).
TRUNCATE TABLE IF EXISTS {{local:samples_6h}} {{on_cluster}};

INSERT INTO samples_6h
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
    max(value_last) AS value_last
FROM (SELECT metric, fingerprint, ts AS hour_ts, resets, value_min, value_max, value_sum, value_count, value_first,
             value_last FROM samples_1h)
GROUP BY metric, fingerprint, ts
SETTINGS max_bytes_before_external_group_by = 2000000000;

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
    max(value_last) AS value_last
FROM (SELECT metric, fingerprint, ts AS hour_ts, resets, value_min, value_max, value_sum, value_count, value_first,
             value_last FROM {{local:samples_1h}})
GROUP BY metric, fingerprint, ts;
