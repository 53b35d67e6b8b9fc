-- A retried insert rolled up once (found in review of 0016): the collector's writer replays a
-- spooled batch with its deduplication token when it cannot tell whether an insert landed, and
-- `deduplicate_blocks_in_dependent_materialized_views` carries the token to the views. The raw
-- tables drop the repeat (their `non_replicated_deduplication_window`), but the rollups had no
-- window, so a replayed batch added its sums, counts and increases to them a second time (chDB
-- deduplicates in dependent views by default: this was so before 0016 too). Replicated tables
-- (cluster mode) deduplicate by default; this setting is for single-node stores.
ALTER TABLE {{local:samples_1m}} {{on_cluster}} MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE {{local:samples_1h}} {{on_cluster}} MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE {{local:samples_6h}} {{on_cluster}} MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE {{local:requests_1m}} {{on_cluster}} MODIFY SETTING non_replicated_deduplication_window = 1000;
ALTER TABLE {{local:requests_1h}} {{on_cluster}} MODIFY SETTING non_replicated_deduplication_window = 1000;
