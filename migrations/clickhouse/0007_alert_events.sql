-- Alert history, like Prometheus' ALERTS series: one row per state change of an alert instance
-- (inactive/pending/firing/resolved), written by the evaluator. Current state lives in the
-- metadata DB (alert_states); this table is what the Alerts page and SQL users read back.

CREATE TABLE IF NOT EXISTS {{local:alert_events}} {{on_cluster}} (
    ts DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)) COMMENT 'evaluation time of the change',
    rule LowCardinality(String) COMMENT 'the rule name (= the alertname label)',
    fingerprint String COMMENT 'hash of the instance labels (alerts.model.fingerprint)',
    labels Map(LowCardinality(String), String) COMMENT 'the instance labels, rule labels included',
    state_before LowCardinality(String) COMMENT 'inactive, pending, firing or resolved',
    state LowCardinality(String) COMMENT 'the state entered: pending, firing, resolved or inactive',
    value Nullable(Float64) COMMENT 'the last value that met the condition (NULL for NoData/Error)',
    summary String COMMENT 'the rendered summary annotation'
) ENGINE = {{engine:MergeTree}}
PARTITION BY toYYYYMM(ts)
ORDER BY (rule, ts)
COMMENT 'Alert state changes (history)';

{{distributed:alert_events:cityHash64(fingerprint)}};
