-- Scraped Prometheus metrics (vLLM engines, gateway, simulator).
-- One row per sample; labels live once per series in `series`, joined by fingerprint
-- (DESIGN.md section 6). Counters are stored as scraped; analytics handles resets.

CREATE TABLE IF NOT EXISTS {{local:series}} {{on_cluster}} (
    fingerprint UInt64 COMMENT 'cityHash64 of the metric name and sorted labels',
    metric LowCardinality(String) COMMENT 'metric name as scraped, e.g. vllm:num_requests_running',
    labels Map(LowCardinality(String), String) COMMENT 'all labels, including job and instance',
    instance LowCardinality(String) MATERIALIZED labels['instance'],
    replica LowCardinality(String) MATERIALIZED labels['replica'],
    model LowCardinality(String) MATERIALIZED if(labels['model_name'] != '', labels['model_name'], labels['model']),
    first_seen DateTime('UTC') DEFAULT now(),
    last_seen DateTime('UTC') DEFAULT now()
) ENGINE = {{engine:ReplacingMergeTree(last_seen)}}
ORDER BY (metric, fingerprint)
COMMENT 'One row per time series: its labels, keyed by fingerprint';

{{distributed:series:fingerprint}};

CREATE TABLE IF NOT EXISTS {{local:samples}} {{on_cluster}} (
    metric LowCardinality(String),
    fingerprint UInt64,
    ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    value Float64 CODEC(Gorilla, ZSTD(1))
) ENGINE = {{engine:MergeTree}}
PARTITION BY toDate(ts)
ORDER BY (metric, fingerprint, ts)
SETTINGS ttl_only_drop_parts = 1, non_replicated_deduplication_window = 1000
COMMENT 'Raw samples: (metric, series fingerprint, timestamp, value)';

{{distributed:samples:fingerprint}};

CREATE TABLE IF NOT EXISTS {{local:scrapes}} {{on_cluster}} (
    ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    job LowCardinality(String),
    instance LowCardinality(String),
    replica LowCardinality(String),
    up UInt8 COMMENT '1 when the scrape succeeded, 0 when it failed (then error says why)',
    duration_seconds Float32,
    samples_scraped UInt32,
    error String DEFAULT ''
) ENGINE = {{engine:MergeTree}}
PARTITION BY toDate(ts)
ORDER BY (job, instance, ts)
SETTINGS ttl_only_drop_parts = 1, non_replicated_deduplication_window = 1000
COMMENT 'One row per scrape attempt: up, scrape_duration_seconds, scrape_samples_scraped';

{{distributed:scrapes:cityHash64(instance)}};
