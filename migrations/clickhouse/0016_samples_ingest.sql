-- Raw samples without their increase (issue 44): 0.71 of 1.45 bytes a raw sample after merges
-- went to `samples.increase`, which only the rollups read (raw-tier queries read the values). The
-- collector now inserts into `samples_ingest`, a Null table that keeps nothing: one view copies
-- its rows to `samples` without the increase, the 1-minute and 1-hour rollups sum the increase
-- from it (their views are created again on the new source; the 6-hour rollup reads the hourly one
-- as before), and `samples.increase` is dropped. Raw samples are stored as before, rollups get the
-- same increases, and nothing else changes for a reader.
--
-- Migrate while the collectors are stopped (as 0011): between the views being dropped and created
-- again an insert would miss the rollups; a collector of an older version inserts into `samples`
-- directly and its rows would reach no rollup afterwards.

CREATE TABLE IF NOT EXISTS {{local:samples_ingest}} {{on_cluster}} (
    metric LowCardinality(String),
    fingerprint UInt64,
    ts DateTime64(3, 'UTC'),
    value Float64,
    reset Float64,
    increase Float64
) ENGINE = Null
COMMENT 'Where the collector inserts samples: stored in samples (without increase) and summed into the rollups';

{{distributed:samples_ingest:fingerprint}};

CREATE MATERIALIZED VIEW IF NOT EXISTS samples_ingest_mv {{on_cluster}} TO {{local:samples}} AS
SELECT metric, fingerprint, ts, value, reset FROM {{local:samples_ingest}};

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
FROM (SELECT metric, fingerprint, ts AS raw_ts, value, reset, increase FROM {{local:samples_ingest}})
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
FROM (SELECT metric, fingerprint, ts AS raw_ts, value, reset, increase FROM {{local:samples_ingest}})
GROUP BY metric, fingerprint, ts;

ALTER TABLE {{local:samples}} {{on_cluster}} DROP COLUMN IF EXISTS increase;
ALTER TABLE samples {{on_cluster}} DROP COLUMN IF EXISTS increase;
