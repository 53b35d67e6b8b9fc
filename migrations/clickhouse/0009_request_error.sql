-- Why a request failed, in words ('' when it did not): the gateway's upstream timeouts
-- ("no byte from small-3 within 120 s"), refusals and upstream errors.
ALTER TABLE {{local:requests}} {{on_cluster}}
    ADD COLUMN IF NOT EXISTS error String DEFAULT '' COMMENT 'why the request failed, in words' AFTER outcome;

ALTER TABLE requests {{on_cluster}}
    ADD COLUMN IF NOT EXISTS error String DEFAULT '' COMMENT 'why the request failed, in words' AFTER outcome;
