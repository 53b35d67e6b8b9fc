-- One row per request, joining the gateway's request log row (tenant, route, client-side
-- timings) to the engine's llm_request span (engine timings, tokens) on the W3C trace id.
-- Either side may be missing: has_gateway / has_engine say which were seen.
CREATE VIEW IF NOT EXISTS requests_joined {{on_cluster}} AS
SELECT
    request_key,
    any(r_trace_id) AS trace_id,
    min(r_ts) AS ts,
    anyIf(r_request_id, r_source = 'otlp') AS request_id,
    if(anyIf(r_replica, r_source = 'otlp') != '', anyIf(r_replica, r_source = 'otlp'), anyIf(r_replica, r_source = 'gateway')) AS replica,
    if(anyIf(r_model, r_source = 'otlp') != '', anyIf(r_model, r_source = 'otlp'), anyIf(r_model, r_source = 'gateway')) AS model,
    anyIf(r_tenant, r_source = 'gateway') AS tenant,
    anyIf(r_route, r_source = 'gateway') AS route,
    if(countIf(r_source = 'gateway') > 0, anyIf(r_status_code, r_source = 'gateway'), anyIf(r_status_code, r_source = 'otlp')) AS status_code,
    anyIf(r_finish_reason, r_source = 'gateway') AS finish_reason,
    if(countIf(r_source = 'otlp') > 0, anyIf(r_prompt_tokens, r_source = 'otlp'), anyIf(r_prompt_tokens, r_source = 'gateway')) AS prompt_tokens,
    if(countIf(r_source = 'otlp') > 0, anyIf(r_completion_tokens, r_source = 'otlp'), anyIf(r_completion_tokens, r_source = 'gateway')) AS completion_tokens,
    anyIf(r_cached_tokens, r_source = 'gateway') AS cached_tokens,
    max(r_max_tokens) AS max_tokens,
    anyIf(r_ttft_seconds, r_source = 'otlp') AS ttft_seconds,
    anyIf(r_e2e_seconds, r_source = 'otlp') AS e2e_seconds,
    anyIf(r_queue_seconds, r_source = 'otlp') AS queue_seconds,
    anyIf(r_prefill_seconds, r_source = 'otlp') AS prefill_seconds,
    anyIf(r_decode_seconds, r_source = 'otlp') AS decode_seconds,
    anyIf(r_tpot_seconds, r_source = 'otlp') AS tpot_seconds,
    anyIf(r_ttft_seconds, r_source = 'gateway') AS gateway_ttft_seconds,
    anyIf(r_e2e_seconds, r_source = 'gateway') AS gateway_e2e_seconds,
    countIf(r_source = 'gateway') > 0 AS has_gateway,
    countIf(r_source = 'otlp') > 0 AS has_engine,
    max(r_weight) AS weight
FROM (
    SELECT
        ts AS r_ts,
        source AS r_source,
        request_id AS r_request_id,
        trace_id AS r_trace_id,
        replica AS r_replica,
        model AS r_model,
        tenant AS r_tenant,
        route AS r_route,
        status_code AS r_status_code,
        finish_reason AS r_finish_reason,
        prompt_tokens AS r_prompt_tokens,
        completion_tokens AS r_completion_tokens,
        cached_tokens AS r_cached_tokens,
        max_tokens AS r_max_tokens,
        ttft_seconds AS r_ttft_seconds,
        e2e_seconds AS r_e2e_seconds,
        queue_seconds AS r_queue_seconds,
        prefill_seconds AS r_prefill_seconds,
        decode_seconds AS r_decode_seconds,
        tpot_seconds AS r_tpot_seconds,
        weight AS r_weight,
        if(trace_id != '', trace_id, concat('request:', request_id)) AS request_key
    FROM requests
)
GROUP BY request_key;

-- Histogram bucket bound as a number, so quantile queries need no label parsing.
ALTER TABLE {{local:series}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS le Float64 MATERIALIZED
        if(labels['le'] = '', nan, if(labels['le'] = '+Inf', inf, toFloat64OrNull(labels['le'])))
    COMMENT 'histogram bucket upper bound (NaN when the series has no le label)';

ALTER TABLE series {{on_cluster}}
    ADD COLUMN IF NOT EXISTS le Float64 MATERIALIZED
        if(labels['le'] = '', nan, if(labels['le'] = '+Inf', inf, toFloat64OrNull(labels['le'])));

-- The fingerprint is computed by the collector (collector/convert.py: blake2b, 64 bits).
ALTER TABLE {{local:series}} {{on_cluster}}
    COMMENT COLUMN fingerprint 'blake2b-64 of the metric name and sorted labels (collector/convert.py)';
