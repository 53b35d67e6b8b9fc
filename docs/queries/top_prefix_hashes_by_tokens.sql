-- The prompt prefixes that carry the most tokens (last 24 h): candidates for prefix caching.
-- prefix_hash is the gateway's hash of the first prompt tokens; cached_tokens shows how much the
-- engines' prefix cache already served.
SELECT
    prefix_hash,
    round(sum(weight)) AS requests,
    round(sum(weight * prompt_tokens)) AS prompt_tokens_total,
    round(sum(weight * cached_tokens) / sum(weight * prompt_tokens), 3) AS cached_share,
    uniqExact(tenant) AS tenants
FROM requests
WHERE source = 'gateway' AND ts >= now() - INTERVAL 1 DAY AND prefix_hash != ''
GROUP BY prefix_hash
ORDER BY prompt_tokens_total DESC
LIMIT 20
