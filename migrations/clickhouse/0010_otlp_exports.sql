-- OTLP trace exports as they arrive: the collector hands each protobuf ExportTraceServiceRequest
-- body to ClickHouse unchanged (FORMAT Protobuf, schema collector/otlp_trace.proto passed with the
-- insert), ClickHouse parses it, and this view flattens its llm_request spans into requests rows,
-- exactly as collector.otlp.request_columns does in Python (tests/collector/test_otlp_native.py).
-- Nothing is kept in the landing table (Null engine). A ClickHouse server needs
-- format_schema_source (25.8+; chDB 4.4 has it).
CREATE TABLE IF NOT EXISTS otlp_exports {{on_cluster}} (
    resource_spans Array(Tuple(
        resource Tuple(attributes Array(Tuple(key String, value Tuple(string_value String, int_value Int64, double_value Float64)))),
        scope_spans Array(Tuple(spans Array(Tuple(
            trace_id String,
            name String,
            start_time_unix_nano UInt64,
            end_time_unix_nano UInt64,
            attributes Array(Tuple(key String, value Tuple(string_value String, int_value Int64, double_value Float64))),
            status Tuple(code Int32)
        ))))
    ))
) ENGINE = Null
COMMENT 'OTLP trace exports, parsed by ClickHouse and flattened into requests by otlp_exports_mv (nothing stored)';

-- text(v): the string, else a non-zero integer as text; number(v): the double, else the integer
-- (collector.otlp._text / _number). Attribute lists are reversed before the map is built: the
-- map's lookup takes the first of repeated keys, the Python dict the last. A token count that is
-- not a number a UInt32 holds (NaN, infinite, negative, past 2^32) is stored as 0: one client's
-- bad span must not fail the insert of a batch many clients' bodies share (the Python path
-- refuses such a batch whole).
CREATE MATERIALIZED VIEW IF NOT EXISTS otlp_exports_mv {{on_cluster}} TO requests AS
WITH
    arrayJoin(resource_spans) AS rs,
    mapFromArrays(reverse(rs.resource.attributes.key), reverse(rs.resource.attributes.value)) AS res,
    arrayJoin(rs.scope_spans) AS ss,
    arrayJoin(ss.spans) AS sp,
    mapFromArrays(reverse(sp.attributes.key), reverse(sp.attributes.value)) AS a,
    (v -> if(v.string_value != '', v.string_value, if(v.int_value != 0, toString(v.int_value), ''))) AS text,
    (v -> if(v.double_value != 0, v.double_value, toFloat64(v.int_value))) AS number,
    accurateCastOrDefault(trunc(number(a['gen_ai.usage.completion_tokens'])), 'Int64') AS n_out,
    number(a['gen_ai.latency.time_in_model_decode']) AS decode,
    sp.status.code = 2 AS failed
SELECT
    fromUnixTimestamp64Milli(toInt64(intDiv(sp.start_time_unix_nano, 1000000)), 'UTC') AS ts,
    'otlp' AS source,
    text(a['gen_ai.request.id']) AS request_id,
    lower(hex(sp.trace_id)) AS trace_id,
    if(text(res['fleetscope.replica']) != '', text(res['fleetscope.replica']),
       if(text(res['service.instance.id']) != '', text(res['service.instance.id']), text(res['service.name']))) AS replica,
    if(text(res['fleetscope.model']) != '', text(res['fleetscope.model']), text(a['gen_ai.response.model'])) AS model,
    if(failed, 500, 200) AS status_code,
    accurateCastOrDefault(trunc(number(a['gen_ai.usage.prompt_tokens'])), 'UInt32') AS prompt_tokens,
    accurateCastOrDefault(n_out, 'UInt32') AS completion_tokens,
    accurateCastOrDefault(trunc(number(a['gen_ai.request.max_tokens'])), 'UInt32') AS max_tokens,
    toFloat32(number(a['gen_ai.latency.time_to_first_token'])) AS ttft_seconds,
    toFloat32(number(a['gen_ai.latency.e2e'])) AS e2e_seconds,
    toFloat32(number(a['gen_ai.latency.time_in_queue'])) AS queue_seconds,
    toFloat32(number(a['gen_ai.latency.time_in_model_prefill'])) AS prefill_seconds,
    toFloat32(decode) AS decode_seconds,
    toFloat32(if(n_out > 1, decode / (n_out - 1), 0)) AS tpot_seconds,
    toFloat32(1) AS weight,
    if(failed, 'error', 'ok') AS outcome
FROM otlp_exports
WHERE sp.name = 'llm_request';
