-- Which gateway logged a gateway-side request row: 'fleetscope' (its own gateway's request log),
-- 'litellm', 'envoy', 'genai' (any OpenTelemetry GenAI source) or a user mapping's name
-- (collector/mapping.py); '' on engine rows (source = 'otlp') and on rows from before this column.
ALTER TABLE {{local:requests}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS gateway LowCardinality(String) DEFAULT '' COMMENT 'which gateway logged the row' AFTER source;

ALTER TABLE requests {{on_cluster}}
    ADD COLUMN IF NOT EXISTS gateway LowCardinality(String) DEFAULT '' COMMENT 'which gateway logged the row' AFTER source;
