-- p99 time to first token (seconds) by model, per hour, over the last 7 days.
-- From the gateway's request log (what clients saw); sampled rows count by their weight.
-- For the engines' own view use source = 'otlp'. Long windows read faster from requests_1h:
--   SELECT ts AS hour, model, quantileTDigestWeightedMerge(0.99)(ttft) FROM requests_1h ...
SELECT
    toStartOfHour(ts) AS hour,
    model,
    round(quantileTDigestWeighted(0.99)(ttft_seconds, toUInt64(greatest(1, round(weight)))), 3) AS p99_ttft_s,
    round(sum(weight)) AS requests
FROM requests
WHERE source = 'gateway' AND ts >= now() - INTERVAL 7 DAY AND ttft_seconds > 0
GROUP BY hour, model
ORDER BY hour, model
