-- txbox 0010: purging idle keys never strands a consumer's queued backlog.
--
-- `txbox purge --idle-keys` deletes a consumer's cursor for a key that has
-- not moved for long. Messages of that key may still sit in the consumer's
-- queue (a consumer that was down); without its cursor, the first of them
-- would wait for a predecessor it handled before the purge. So the purge
-- records, per consumer, the horizon it purged before (ms, this database's
-- clock), and each ordered row records when what it waits for was enqueued
-- (ms, the producer database's clock): a row of a key without a cursor does
-- not wait for a predecessor enqueued before the horizon — it was handled
-- and forgotten, or sat in a queue longer than the purge allowed.
ALTER TABLE inbox ADD COLUMN partition_after_at bigint;
ALTER TABLE inbox_consumers ADD COLUMN cursors_purged_before bigint;
