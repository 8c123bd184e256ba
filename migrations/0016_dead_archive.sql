-- txbox 0016: an archive for dead rows, so a partition that holds one can still be dropped.
--
-- `txbox partitions drop` (and a relay's retention) moves the dead rows of a
-- partition it drops into <table>_archive first, with their ids and every
-- column unchanged, plus when they were archived. `txbox dead list` shows
-- them beside the live ones, and `txbox dead redrive` brings them back into
-- the table, pending (into the default partition when their day's partition
-- is gone). Dead inbox rows of ordered keys are never archived: their key
-- waits on them (a redrive or a skip), so their partition stays.
CREATE TABLE outbox_archive (LIKE outbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE outbox_archive
  ADD CONSTRAINT outbox_archive_pkey PRIMARY KEY (id),
  ADD COLUMN archived_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX outbox_archive_occurred ON outbox_archive (occurred_at);

CREATE TABLE inbox_archive (LIKE inbox INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE inbox_archive
  ADD CONSTRAINT inbox_archive_pkey PRIMARY KEY (message_id, consumer),
  ADD COLUMN archived_at timestamptz NOT NULL DEFAULT now();
CREATE INDEX inbox_archive_received ON inbox_archive (received_at);
