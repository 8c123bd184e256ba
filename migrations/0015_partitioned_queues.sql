-- txbox 0015: the outbox and the inbox become partitioned tables (issue #26).
--
-- Both are partitioned by range of their message id: outbox.id and
-- inbox.message_id. Ids from enqueue are UUIDv7, whose first 48 bits are the
-- enqueue time in ms, so a range of ids is a range of time, and every copy of a
-- message (a redelivery, a duplicate) lands in the same partition: the primary
-- key dedupes within it, which is dedupe everywhere. Partitions are created
-- ahead of time by txbox (`txbox partitions create`, `txbox migrate`, the
-- relay's and the inbox's housekeeping), one per day unless told otherwise,
-- named <table>_p<start as yyyymmdd[hh]>. Old ones are dropped whole
-- (`txbox partitions drop`) once they hold no pending and no dead row.
--
-- The existing table becomes the DEFAULT partition (<table>_default): rows
-- already there stay there, and so does any row whose id falls in no day
-- partition (an id given by hand that is not a UUIDv7, a business key, a day
-- whose partition was never created). The default partition is never dropped;
-- `txbox purge` keeps deleting its old rows as before.
--
-- Locks: the renames, the new parent and the ATTACH ... DEFAULT take an ACCESS
-- EXCLUSIVE lock on the old table for the length of the transaction; nothing
-- is copied or rewritten and, with no other partition yet, the attach scans
-- nothing. It waits for transactions that use the table to end and blocks new
-- ones meanwhile (milliseconds on an idle system; run it between deploys).

-- The outbox.
ALTER TABLE outbox RENAME TO outbox_default;
ALTER INDEX outbox_pkey RENAME TO outbox_default_pkey;
ALTER INDEX outbox_due RENAME TO outbox_default_due;
ALTER INDEX outbox_dead RENAME TO outbox_default_dead;
ALTER INDEX outbox_sent RENAME TO outbox_default_sent;

CREATE TABLE outbox (LIKE outbox_default INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
  PARTITION BY RANGE (id);
ALTER TABLE outbox ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);
CREATE INDEX outbox_due ON outbox (visible_at) WHERE status = 'pending';
CREATE INDEX outbox_dead ON outbox (occurred_at) WHERE status = 'dead';
CREATE INDEX outbox_sent ON outbox (published_at) WHERE status = 'sent';
-- Its indexes match the parent's, so they are attached as they are, not built again.
ALTER TABLE outbox ATTACH PARTITION outbox_default DEFAULT;

-- The inbox.
DROP TRIGGER inbox_notify ON inbox;
ALTER TABLE inbox RENAME TO inbox_default;
ALTER INDEX inbox_pkey RENAME TO inbox_default_pkey;
ALTER INDEX inbox_due RENAME TO inbox_default_due;
ALTER INDEX inbox_dead RENAME TO inbox_default_dead;
ALTER INDEX inbox_processed RENAME TO inbox_default_processed;
ALTER INDEX inbox_ordered RENAME TO inbox_default_ordered;

CREATE TABLE inbox (LIKE inbox_default INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
  PARTITION BY RANGE (message_id);
ALTER TABLE inbox ADD CONSTRAINT inbox_pkey PRIMARY KEY (message_id, consumer);
CREATE INDEX inbox_due ON inbox (consumer, visible_at) WHERE status = 'pending';
CREATE INDEX inbox_dead ON inbox (received_at) WHERE status = 'dead';
CREATE INDEX inbox_processed ON inbox (processed_at) WHERE status = 'processed';
CREATE INDEX inbox_ordered ON inbox (consumer, partition_key, partition_epoch, partition_seq)
  WHERE partition_seq IS NOT NULL AND status <> 'processed';
ALTER TABLE inbox ATTACH PARTITION inbox_default DEFAULT;

-- Row triggers on a partitioned table are cloned onto every partition, new ones included.
CREATE TRIGGER inbox_notify AFTER INSERT ON inbox
  FOR EACH ROW WHEN (NEW.status = 'pending') EXECUTE FUNCTION inbox_notify();
