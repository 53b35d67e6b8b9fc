-- Replicas whose KV cache stayed saturated (above 0.9) for at least 10 minutes in a row (last
-- 24 h). A minute counts as saturated when the cache reached 0.9 in it, as the built-in
-- KVCacheSaturated rule reads it (usage swings within a minute as requests finish and free
-- blocks); runs of consecutive saturated minutes are kept when they last 10 minutes or more.
WITH
    kv AS (
        SELECT s.replica AS replica, toStartOfMinute(v.ts) AS minute, max(v.value) AS highest
        FROM samples AS v
        INNER JOIN (
            SELECT fingerprint, argMax(replica, last_seen) AS replica
            FROM series WHERE metric = 'vllm:kv_cache_usage_perc' GROUP BY fingerprint
        ) AS s ON s.fingerprint = v.fingerprint
        WHERE v.metric = 'vllm:kv_cache_usage_perc' AND v.ts >= now() - INTERVAL 1 DAY
        GROUP BY replica, minute
    ),
    full_minutes AS (
        SELECT replica, minute,
               toUnixTimestamp(minute) - 60 * row_number() OVER (PARTITION BY replica ORDER BY minute) AS run
        FROM kv
        WHERE highest > 0.9
    )
SELECT replica, min(minute) AS since, max(minute) + INTERVAL 1 MINUTE AS until, count() AS minutes
FROM full_minutes
GROUP BY replica, run
HAVING minutes >= 10
ORDER BY since, replica
