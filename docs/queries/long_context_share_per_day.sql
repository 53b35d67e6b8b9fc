-- Share of long-context requests per day (last 30 days), by requests and by tokens.
-- "Long" as fleetscope's explain means it: a prompt over 3x the median prompt of the period.
WITH
    (SELECT quantileExact(0.5)(prompt_tokens) FROM requests
     WHERE source = 'gateway' AND ts >= now() - INTERVAL 30 DAY) * 3 AS long_tokens
SELECT
    toDate(ts) AS day,
    round(sumIf(weight, prompt_tokens > long_tokens) / sum(weight), 4) AS long_share_of_requests,
    round(sumIf(weight * prompt_tokens, prompt_tokens > long_tokens) / sum(weight * prompt_tokens), 4)
        AS long_share_of_prompt_tokens,
    any(long_tokens) AS long_above_tokens,
    round(sum(weight)) AS requests
FROM requests
WHERE source = 'gateway' AND ts >= now() - INTERVAL 30 DAY
GROUP BY day
ORDER BY day
