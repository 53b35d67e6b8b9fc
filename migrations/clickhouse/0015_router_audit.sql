-- The router audit (issue 43): a sample of the model router's decisions replayed in shadow on the
-- other model, off the user's path. A shadow request is a row of its own (tenant: the audit's,
-- route 'shadow'): audit_of names the request it shadows, agreement compares the two answers'
-- words, and the judge's scores of both answers where a judge is configured.
ALTER TABLE {{local:requests}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS audit_of String DEFAULT '' COMMENT 'trace id of the request this one shadows (router audit); empty for a user request',
    ADD COLUMN IF NOT EXISTS audit_direction LowCardinality(String) DEFAULT '' COMMENT 'small_to_large or large_to_small: the routed model and the shadow''s',
    ADD COLUMN IF NOT EXISTS agreement Float32 DEFAULT -1 COMMENT 'word agreement of the shadow''s answer with the routed one, 0-1 (unigram F1); -1: none',
    ADD COLUMN IF NOT EXISTS judge_routed Float32 DEFAULT -1 COMMENT 'the judge''s score of the routed answer, 0-1; -1: not judged',
    ADD COLUMN IF NOT EXISTS judge_shadow Float32 DEFAULT -1 COMMENT 'the judge''s score of the shadow''s answer, 0-1; -1: not judged';

ALTER TABLE requests {{on_cluster}}
    ADD COLUMN IF NOT EXISTS audit_of String DEFAULT '' COMMENT 'trace id of the request this one shadows (router audit); empty for a user request',
    ADD COLUMN IF NOT EXISTS audit_direction LowCardinality(String) DEFAULT '' COMMENT 'small_to_large or large_to_small: the routed model and the shadow''s',
    ADD COLUMN IF NOT EXISTS agreement Float32 DEFAULT -1 COMMENT 'word agreement of the shadow''s answer with the routed one, 0-1 (unigram F1); -1: none',
    ADD COLUMN IF NOT EXISTS judge_routed Float32 DEFAULT -1 COMMENT 'the judge''s score of the routed answer, 0-1; -1: not judged',
    ADD COLUMN IF NOT EXISTS judge_shadow Float32 DEFAULT -1 COMMENT 'the judge''s score of the shadow''s answer, 0-1; -1: not judged';
