-- Rollups (DESIGN.md section 6): materialized views from the append-only raw tables into
-- AggregatingMergeTree tables at 1 minute and 1 hour. Both tiers are fed from the raw inserts
-- (not from each other), so each is exact on its own. Queries pick a tier by time range
-- (analytics/tiers.py). Retention per tier is set by `fleetscope migrate` from the config
-- (storage/retention.py), not here.

-- Counter resets, marked by the collector when it writes the sample (it knows the previous
-- value): on the first sample after a reset (a counter, histogram bucket, sum or count that
-- went down: the engine restarted), the value before it; 0 everywhere else, so the column
-- costs next to nothing. The increase of a series between two samples a and b is then
--   v_b - v_a + sum(reset over the samples after a up to b)
-- (Prometheus' increase(): after a reset the counter counts from zero), and the rollups only
-- need each bucket's first and last value and its sum of resets.
ALTER TABLE {{local:samples}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS reset Float64 DEFAULT 0 CODEC(ZSTD(1))
    COMMENT 'counters: on the first sample after a reset, the value before it; else 0';

ALTER TABLE samples {{on_cluster}}
    ADD COLUMN IF NOT EXISTS reset Float64 DEFAULT 0;

-- Delta of the 64-bit patterns compresses counter values (growing) and gauges (mostly steady)
-- better than Gorilla on vLLM expositions (bench/bench_warehouse.py).
ALTER TABLE {{local:samples}} {{on_cluster}} MODIFY COLUMN value Float64 CODEC(Delta, ZSTD(1));

-- Per series and bucket: first and last value and the resets (counters), min / max / sum / count (gauges).
CREATE TABLE IF NOT EXISTS {{local:samples_1m}} {{on_cluster}} (
    metric LowCardinality(String),
    fingerprint UInt64,
    ts DateTime('UTC') CODEC(DoubleDelta, ZSTD(1)) COMMENT 'start of the minute',
    resets SimpleAggregateFunction(sum, Float64) COMMENT 'counters: sum of samples.reset in the bucket',
    value_min SimpleAggregateFunction(min, Float64) COMMENT 'inf when the bucket has no finite sample',
    value_max SimpleAggregateFunction(max, Float64) COMMENT '-inf when the bucket has no finite sample',
    value_sum SimpleAggregateFunction(sum, Float64) COMMENT 'sum of the finite values (avg = value_sum / value_count)',
    value_count SimpleAggregateFunction(sum, UInt64) COMMENT 'number of finite samples',
    value_first SimpleAggregateFunction(min, Tuple(DateTime64(3, 'UTC'), Float64, Float64)) COMMENT '(time, value, reset) of the first sample that is not NaN',
    value_last SimpleAggregateFunction(max, Tuple(DateTime64(3, 'UTC'), Float64)) COMMENT '(time, value) of the last sample that is not NaN'
) ENGINE = {{engine:AggregatingMergeTree}}
PARTITION BY toDate(ts)
ORDER BY (metric, fingerprint, ts)
SETTINGS ttl_only_drop_parts = 1
COMMENT 'Samples rolled up per series and minute (from samples, by samples_1m_mv)';

{{distributed:samples_1m:fingerprint}};

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
    max(if(isNaN(value), (toDateTime64(0, 3, 'UTC'), value), (raw_ts, value))) AS value_last
FROM (SELECT metric, fingerprint, ts AS raw_ts, value, reset FROM {{local:samples}})
GROUP BY metric, fingerprint, ts;

CREATE TABLE IF NOT EXISTS {{local:samples_1h}} {{on_cluster}} AS {{local:samples_1m}}
ENGINE = {{engine:AggregatingMergeTree}}
PARTITION BY toYYYYMM(ts)
ORDER BY (metric, fingerprint, ts)
SETTINGS ttl_only_drop_parts = 1
COMMENT 'Samples rolled up per series and hour (from samples, by samples_1h_mv)';

ALTER TABLE {{local:samples_1h}} {{on_cluster}} COMMENT COLUMN ts 'start of the hour';

{{distributed:samples_1h:fingerprint}};

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
    max(if(isNaN(value), (toDateTime64(0, 3, 'UTC'), value), (raw_ts, value))) AS value_last
FROM (SELECT metric, fingerprint, ts AS raw_ts, value, reset FROM {{local:samples}})
GROUP BY metric, fingerprint, ts;

-- Request-log aggregates per bucket and dimension set (not per replica: the engines' own
-- histograms in samples_* give per-replica latency; here tenants and routes matter). Sampled rows carry weight = 1 / p, so
-- `requests` and the token sums are unbiased estimates of the totals; the latency and size
-- sketches (t-digest) are weighted by round(weight). Zero latencies (a request rejected before
-- it produced a token) are left out of the latency sketches.
CREATE TABLE IF NOT EXISTS {{local:requests_1m}} {{on_cluster}} (
    ts DateTime('UTC') CODEC(DoubleDelta, ZSTD(1)) COMMENT 'start of the minute',
    source LowCardinality(String),
    model LowCardinality(String),
    tenant LowCardinality(String),
    route LowCardinality(String),
    outcome LowCardinality(String),
    finish_reason LowCardinality(String),
    context_bucket LowCardinality(String) COMMENT 'prompt tokens: <2k, 2-8k, 8-32k, >32k (k = 1024)',
    rows SimpleAggregateFunction(sum, UInt64) COMMENT 'sampled rows',
    requests SimpleAggregateFunction(sum, Float64) COMMENT 'sum of weight: estimated requests',
    prompt_tokens SimpleAggregateFunction(sum, Float64) COMMENT 'weighted sum',
    completion_tokens SimpleAggregateFunction(sum, Float64) COMMENT 'weighted sum',
    cached_tokens SimpleAggregateFunction(sum, Float64) COMMENT 'weighted sum',
    ttft AggregateFunction(quantileTDigestWeighted, Float32, UInt64),
    e2e AggregateFunction(quantileTDigestWeighted, Float32, UInt64),
    tpot AggregateFunction(quantileTDigestWeighted, Float32, UInt64),
    itl AggregateFunction(quantileTDigestWeighted, Float32, UInt64),
    queue AggregateFunction(quantileTDigestWeighted, Float32, UInt64),
    prompt_tokens_q AggregateFunction(quantileTDigestWeighted, Float32, UInt64) COMMENT 'distribution of prompt tokens',
    completion_tokens_q AggregateFunction(quantileTDigestWeighted, Float32, UInt64) COMMENT 'distribution of output tokens',
    max_tokens_q AggregateFunction(quantileTDigestWeighted, Float32, UInt64) COMMENT 'distribution of max_tokens'
) ENGINE = {{engine:AggregatingMergeTree}}
PARTITION BY toDate(ts)
ORDER BY (model, tenant, ts, source, route, outcome, finish_reason, context_bucket)
SETTINGS ttl_only_drop_parts = 1
COMMENT 'Request log rolled up per minute and dimension set (from requests, by requests_1m_mv)';

{{distributed:requests_1m:rand()}};

CREATE MATERIALIZED VIEW IF NOT EXISTS requests_1m_mv {{on_cluster}} TO {{local:requests_1m}} AS
SELECT
    toStartOfMinute(raw_ts) AS ts,
    source, model, tenant, route, outcome, finish_reason,
    multiIf(p < 2048, '<2k', p < 8192, '2-8k', p < 32768, '8-32k', '>32k') AS context_bucket,
    count() AS rows,
    sum(wt) AS requests,
    sum(wt * p) AS prompt_tokens,
    sum(wt * c) AS completion_tokens,
    sum(wt * k) AS cached_tokens,
    quantileTDigestWeightedState(if(ttft_seconds > 0, ttft_seconds, toFloat32(nan)), w) AS ttft,
    quantileTDigestWeightedState(if(e2e_seconds > 0, e2e_seconds, toFloat32(nan)), w) AS e2e,
    quantileTDigestWeightedState(if(tpot_seconds > 0, tpot_seconds, toFloat32(nan)), w) AS tpot,
    quantileTDigestWeightedState(if(itl_seconds > 0, itl_seconds, toFloat32(nan)), w) AS itl,
    quantileTDigestWeightedState(if(queue_seconds > 0, queue_seconds, toFloat32(nan)), w) AS queue,
    quantileTDigestWeightedState(toFloat32(p), w) AS prompt_tokens_q,
    quantileTDigestWeightedState(toFloat32(c), w) AS completion_tokens_q,
    quantileTDigestWeightedState(toFloat32(m), w) AS max_tokens_q
FROM (
    SELECT ts AS raw_ts, source, model, tenant, route, outcome, finish_reason,
           prompt_tokens AS p, completion_tokens AS c, cached_tokens AS k, max_tokens AS m,
           toFloat64(weight) AS wt, toUInt64(greatest(1, round(weight))) AS w,
           ttft_seconds, e2e_seconds, tpot_seconds, itl_seconds, queue_seconds
    FROM {{local:requests}}
)
GROUP BY ts, source, model, tenant, route, outcome, finish_reason, context_bucket;

CREATE TABLE IF NOT EXISTS {{local:requests_1h}} {{on_cluster}} AS {{local:requests_1m}}
ENGINE = {{engine:AggregatingMergeTree}}
PARTITION BY toYYYYMM(ts)
ORDER BY (model, tenant, ts, source, route, outcome, finish_reason, context_bucket)
SETTINGS ttl_only_drop_parts = 1
COMMENT 'Request log rolled up per hour and dimension set (from requests, by requests_1h_mv)';

ALTER TABLE {{local:requests_1h}} {{on_cluster}} COMMENT COLUMN ts 'start of the hour';

{{distributed:requests_1h:rand()}};

CREATE MATERIALIZED VIEW IF NOT EXISTS requests_1h_mv {{on_cluster}} TO {{local:requests_1h}} AS
SELECT
    toStartOfHour(raw_ts) AS ts,
    source, model, tenant, route, outcome, finish_reason,
    multiIf(p < 2048, '<2k', p < 8192, '2-8k', p < 32768, '8-32k', '>32k') AS context_bucket,
    count() AS rows,
    sum(wt) AS requests,
    sum(wt * p) AS prompt_tokens,
    sum(wt * c) AS completion_tokens,
    sum(wt * k) AS cached_tokens,
    quantileTDigestWeightedState(if(ttft_seconds > 0, ttft_seconds, toFloat32(nan)), w) AS ttft,
    quantileTDigestWeightedState(if(e2e_seconds > 0, e2e_seconds, toFloat32(nan)), w) AS e2e,
    quantileTDigestWeightedState(if(tpot_seconds > 0, tpot_seconds, toFloat32(nan)), w) AS tpot,
    quantileTDigestWeightedState(if(itl_seconds > 0, itl_seconds, toFloat32(nan)), w) AS itl,
    quantileTDigestWeightedState(if(queue_seconds > 0, queue_seconds, toFloat32(nan)), w) AS queue,
    quantileTDigestWeightedState(toFloat32(p), w) AS prompt_tokens_q,
    quantileTDigestWeightedState(toFloat32(c), w) AS completion_tokens_q,
    quantileTDigestWeightedState(toFloat32(m), w) AS max_tokens_q
FROM (
    SELECT ts AS raw_ts, source, model, tenant, route, outcome, finish_reason,
           prompt_tokens AS p, completion_tokens AS c, cached_tokens AS k, max_tokens AS m,
           toFloat64(weight) AS wt, toUInt64(greatest(1, round(weight))) AS w,
           ttft_seconds, e2e_seconds, tpot_seconds, itl_seconds, queue_seconds
    FROM {{local:requests}}
)
GROUP BY ts, source, model, tenant, route, outcome, finish_reason, context_bucket;
