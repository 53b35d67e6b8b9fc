-- Fields of the gateway's request log (fleet/gateway): session, the routing reason, the
-- outcome (ok, rejected, timeout, client_abort, upstream_error, no_replica), client-side mean
-- inter-token latency, a hash of the prompt prefix, and whether the response streamed.
ALTER TABLE {{local:requests}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS session String DEFAULT '' AFTER tenant,
    ADD COLUMN IF NOT EXISTS route_reason String DEFAULT '' AFTER route,
    ADD COLUMN IF NOT EXISTS outcome LowCardinality(String) DEFAULT 'ok' AFTER status_code,
    ADD COLUMN IF NOT EXISTS itl_seconds Float32 DEFAULT 0 AFTER tpot_seconds,
    ADD COLUMN IF NOT EXISTS prefix_hash String DEFAULT '' COMMENT 'hash of the first N prompt tokens (shared-prefix analysis)',
    ADD COLUMN IF NOT EXISTS stream UInt8 DEFAULT 0;

ALTER TABLE requests {{on_cluster}}
    ADD COLUMN IF NOT EXISTS session String DEFAULT '' AFTER tenant,
    ADD COLUMN IF NOT EXISTS route_reason String DEFAULT '' AFTER route,
    ADD COLUMN IF NOT EXISTS outcome LowCardinality(String) DEFAULT 'ok' AFTER status_code,
    ADD COLUMN IF NOT EXISTS itl_seconds Float32 DEFAULT 0 AFTER tpot_seconds,
    ADD COLUMN IF NOT EXISTS prefix_hash String DEFAULT '',
    ADD COLUMN IF NOT EXISTS stream UInt8 DEFAULT 0;

-- requests_joined with the new gateway fields
CREATE OR REPLACE VIEW requests_joined {{on_cluster}} AS
SELECT
    request_key,
    any(r_trace_id) AS trace_id,
    min(r_ts) AS ts,
    anyIf(r_request_id, r_source = 'otlp') AS request_id,
    if(anyIf(r_replica, r_source = 'otlp') != '', anyIf(r_replica, r_source = 'otlp'), anyIf(r_replica, r_source = 'gateway')) AS replica,
    if(anyIf(r_model, r_source = 'otlp') != '', anyIf(r_model, r_source = 'otlp'), anyIf(r_model, r_source = 'gateway')) AS model,
    anyIf(r_tenant, r_source = 'gateway') AS tenant,
    anyIf(r_route, r_source = 'gateway') AS route,
    anyIf(r_route_reason, r_source = 'gateway') AS route_reason,
    anyIf(r_session, r_source = 'gateway') AS session,
    if(countIf(r_source = 'gateway') > 0, anyIf(r_outcome, r_source = 'gateway'), anyIf(r_outcome, r_source = 'otlp')) AS outcome,
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
    anyIf(r_itl_seconds, r_source = 'gateway') AS gateway_itl_seconds,
    anyIf(r_prefix_hash, r_source = 'gateway') AS prefix_hash,
    anyIf(r_stream, r_source = 'gateway') AS stream,
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
        session AS r_session,
        route_reason AS r_route_reason,
        outcome AS r_outcome,
        itl_seconds AS r_itl_seconds,
        prefix_hash AS r_prefix_hash,
        stream AS r_stream,
        if(trace_id != '', trace_id, concat('request:', request_id)) AS request_key
    FROM requests
)
GROUP BY request_key;
