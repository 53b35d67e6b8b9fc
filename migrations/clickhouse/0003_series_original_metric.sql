-- The metric name as the engine exposed it, when fleetscope maps an old vLLM name to the
-- current one (e.g. vllm:gpu_cache_usage_perc -> vllm:kv_cache_usage_perc).
ALTER TABLE {{local:series}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS original_metric LowCardinality(String) DEFAULT metric
    COMMENT 'metric name as scraped, before mapping old vLLM names' AFTER metric;

-- On a cluster the Distributed table needs the column too (a no-op on a single node).
ALTER TABLE series {{on_cluster}}
    ADD COLUMN IF NOT EXISTS original_metric LowCardinality(String) DEFAULT metric AFTER metric;
