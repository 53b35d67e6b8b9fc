-- Quality signals (issue 43): a sampled answer scored by the gateway's evaluators. Only the scores
-- and a hash of the answer are kept; the answer's text only where the gateway is told to keep it
-- (quality.keep_text, with its redactions). Rows not evaluated keep the defaults (evaluated = 0).
ALTER TABLE {{local:requests}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS evaluated UInt8 DEFAULT 0 COMMENT '1 when the answer was sampled and scored',
    ADD COLUMN IF NOT EXISTS answer_hash String DEFAULT '' COMMENT 'hash of the answer text (sha256, 16 hex digits)',
    ADD COLUMN IF NOT EXISTS answer_chars UInt32 DEFAULT 0 COMMENT 'characters in the answer',
    ADD COLUMN IF NOT EXISTS truncated UInt8 DEFAULT 0 COMMENT '1: stopped at max_tokens (finish reason length)',
    ADD COLUMN IF NOT EXISTS empty_answer UInt8 DEFAULT 0 COMMENT '1: no or almost no text',
    ADD COLUMN IF NOT EXISTS refusal UInt8 DEFAULT 0 COMMENT '1: the answer matches a refusal pattern',
    ADD COLUMN IF NOT EXISTS repetition Float32 DEFAULT 0 COMMENT 'share of repeated word n-grams (degeneration), 0-1',
    ADD COLUMN IF NOT EXISTS json_valid Int8 DEFAULT -1 COMMENT '-1: JSON not asked, 0: asked and invalid, 1: valid',
    ADD COLUMN IF NOT EXISTS answer_text String DEFAULT '' COMMENT 'the answer, only with quality.keep_text (redacted)';

ALTER TABLE requests {{on_cluster}}
    ADD COLUMN IF NOT EXISTS evaluated UInt8 DEFAULT 0 COMMENT '1 when the answer was sampled and scored',
    ADD COLUMN IF NOT EXISTS answer_hash String DEFAULT '' COMMENT 'hash of the answer text (sha256, 16 hex digits)',
    ADD COLUMN IF NOT EXISTS answer_chars UInt32 DEFAULT 0 COMMENT 'characters in the answer',
    ADD COLUMN IF NOT EXISTS truncated UInt8 DEFAULT 0 COMMENT '1: stopped at max_tokens (finish reason length)',
    ADD COLUMN IF NOT EXISTS empty_answer UInt8 DEFAULT 0 COMMENT '1: no or almost no text',
    ADD COLUMN IF NOT EXISTS refusal UInt8 DEFAULT 0 COMMENT '1: the answer matches a refusal pattern',
    ADD COLUMN IF NOT EXISTS repetition Float32 DEFAULT 0 COMMENT 'share of repeated word n-grams (degeneration), 0-1',
    ADD COLUMN IF NOT EXISTS json_valid Int8 DEFAULT -1 COMMENT '-1: JSON not asked, 0: asked and invalid, 1: valid',
    ADD COLUMN IF NOT EXISTS answer_text String DEFAULT '' COMMENT 'the answer, only with quality.keep_text (redacted)';
