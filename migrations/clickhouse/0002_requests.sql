-- Sampled per-request log: vLLM `llm_request` spans (OTLP) and the gateway's request log.
-- Sampled rows carry `weight` (1 / sampling probability) so sums stay unbiased.

CREATE TABLE IF NOT EXISTS {{local:requests}} {{on_cluster}} (
    ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)) COMMENT 'request arrival time',
    source LowCardinality(String) COMMENT 'otlp (engine span) or gateway (request log)',
    request_id String,
    trace_id String COMMENT 'W3C trace id, joins gateway rows to engine spans',
    replica LowCardinality(String),
    model LowCardinality(String),
    tenant LowCardinality(String),
    route LowCardinality(String) COMMENT 'gateway routing decision, e.g. model-router:long-prompt',
    status_code UInt16,
    finish_reason LowCardinality(String),
    prompt_tokens UInt32,
    completion_tokens UInt32,
    cached_tokens UInt32,
    max_tokens UInt32,
    ttft_seconds Float32,
    e2e_seconds Float32,
    queue_seconds Float32,
    prefill_seconds Float32,
    decode_seconds Float32,
    tpot_seconds Float32 COMMENT 'mean time per output token after the first',
    weight Float32 DEFAULT 1 COMMENT '1 / sampling probability'
) ENGINE = {{engine:MergeTree}}
PARTITION BY toDate(ts)
ORDER BY (model, tenant, ts)
SETTINGS ttl_only_drop_parts = 1, non_replicated_deduplication_window = 1000
COMMENT 'Sampled request log (weighted rows)';

{{distributed:requests:cityHash64(request_id)}};
