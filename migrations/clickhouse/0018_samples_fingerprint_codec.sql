-- The raw samples' fingerprint compressed with ZSTD (issue 44): it had the default codec (LZ4),
-- 0.097 bytes a raw sample after merges on the warehouse bench's 15 minutes of raw samples (a
-- series' run in a part is ~180 samples there, and each run starts with an 8-byte hash no codec
-- shrinks); ZSTD(1) stores it in 0.063, Delta + ZSTD in 0.068, DoubleDelta or T64 in more, at the
-- same insert and merge time. The other columns' codecs stay (value: Delta(8) + ZSTD(1) is 0.69;
-- ZSTD(3) to ZSTD(9) saved 0.005 to 0.05 at up to 1.7x the insert and merge time, ZSTD(12) 0.06 at
-- 6x: CPU is the collector's scarce resource). Metadata only: parts written before keep LZ4 until
-- a merge rewrites them.
ALTER TABLE {{local:samples}} {{on_cluster}} MODIFY COLUMN fingerprint UInt64 CODEC(ZSTD(1));
