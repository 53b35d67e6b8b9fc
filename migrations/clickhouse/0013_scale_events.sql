-- Autoscaling, observed: one row per decision of the bundled fleet's autoscaler (scale_out,
-- scale_in, held_at_max, flap_guard) and per step of the replicas it starts and stops (ready,
-- serving, draining, removed, start_failed), tied to their decision by decision_id. Written by
-- the collector (POST /v1/events from the live autoscaler) and by the simulator in virtual time.

CREATE TABLE IF NOT EXISTS {{local:scale_events}} {{on_cluster}} (
    ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)) COMMENT 'when it happened',
    pool LowCardinality(String) COMMENT 'the model the pool of replicas serves',
    kind LowCardinality(String) COMMENT 'scale_out, scale_in, held_at_max, flap_guard; ready, serving, draining, removed, start_failed',
    decision_id String COMMENT 'the decision a replica step belongs to',
    replica String COMMENT 'the replica started or stopped (empty for a hold)',
    from_replicas UInt16 COMMENT 'pool size (ready + starting) before the decision',
    to_replicas UInt16 COMMENT 'pool size the decision asks for',
    signal LowCardinality(String) COMMENT 'the signal that decided: kv_cache_usage, requests_waiting, requests_running, ttft_p99_over_slo, min_replicas, max_replicas',
    value Float64 COMMENT 'its value (mean per ready replica) at the decision',
    threshold Float64 COMMENT 'the threshold it crossed',
    crossed_at Nullable(DateTime64(3, 'UTC')) COMMENT 'when the signal first crossed the threshold',
    source LowCardinality(String) COMMENT 'autoscaler (live) or sim (virtual time)',
    detail String COMMENT 'the decision in words, or the step''s detail'
) ENGINE = {{engine:MergeTree}}
PARTITION BY toYYYYMM(ts)
ORDER BY (pool, ts)
COMMENT 'Autoscaler decisions and the replica steps that follow them';

{{distributed:scale_events:cityHash64(pool)}};
