-- Requests slower than the SLO by route (last 24 h): time to first token over the threshold
-- below (fleetscope's SLO targets: `fleetscope slo list`), counted by the gateway's routing
-- decision, with the share of that route's requests.
WITH 2.0 AS ttft_slo_s
SELECT
    route,
    round(sumIf(weight, ttft_seconds > ttft_slo_s)) AS slow_requests,
    round(sum(weight)) AS requests,
    round(sumIf(weight, ttft_seconds > ttft_slo_s) / sum(weight), 4) AS slow_share,
    round(quantileTDigestWeighted(0.99)(ttft_seconds, toUInt64(greatest(1, round(weight)))), 3) AS p99_ttft_s
FROM requests
WHERE source = 'gateway' AND ts >= now() - INTERVAL 1 DAY AND ttft_seconds > 0
GROUP BY route
HAVING slow_requests > 0
ORDER BY slow_requests DESC
