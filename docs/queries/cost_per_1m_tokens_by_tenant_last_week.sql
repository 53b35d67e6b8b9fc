-- Cost per 1M tokens by tenant over the last 7 days (showback, in SQL).
-- Spend: each replica's hours with a successful scrape x its GPUs x the price per GPU-hour set
-- below (fleetscope keeps prices in the metadata DB: `fleetscope prices list`; the dashboard's
-- Cost page uses them). Each model pool's spend is shared among tenants by their tokens.
WITH
    0.10 AS usd_per_gpu_hour,
    up AS (
        SELECT replica, uniqExact(toStartOfMinute(ts)) / 60 AS up_hours
        FROM scrapes WHERE up = 1 AND ts >= now() - INTERVAL 7 DAY GROUP BY replica
    ),
    pools AS (
        SELECT s.pool AS model, sum(up.up_hours * s.gpus) * usd_per_gpu_hour AS spend_usd
        FROM up
        INNER JOIN (
            SELECT replica, argMax(model, last_seen) AS pool,
                   toUInt32OrDefault(argMax(labels['gpu_count'], last_seen), toUInt32(1)) AS gpus
            FROM series WHERE replica != '' GROUP BY replica HAVING pool != ''
        ) AS s ON s.replica = up.replica
        GROUP BY s.pool
    ),
    usage AS (
        SELECT tenant, model, sum(weight * (prompt_tokens + completion_tokens)) AS tokens
        FROM requests WHERE source = 'gateway' AND ts >= now() - INTERVAL 7 DAY
        GROUP BY tenant, model
    )
SELECT
    u.tenant AS tenant,
    round(sum(u.tokens)) AS tokens,
    round(sum(p.spend_usd * u.tokens / t.pool_tokens), 4) AS spend_usd,
    round(sum(p.spend_usd * u.tokens / t.pool_tokens) / sum(u.tokens) * 1e6, 4) AS usd_per_1m_tokens
FROM usage AS u
INNER JOIN pools AS p ON p.model = u.model
INNER JOIN (SELECT model, sum(tokens) AS pool_tokens FROM usage GROUP BY model) AS t ON t.model = u.model
GROUP BY tenant
ORDER BY spend_usd DESC
