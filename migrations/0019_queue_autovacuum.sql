-- txbox 0019: autovacuum settings that fit a queue, on every partition of the
-- outbox and the inbox (issue #26; partitions made later get them from
-- `txbox partitions create` and the relays' and inboxes' retention).
--
-- PostgreSQL's defaults vacuum a table once a fifth of its rows are dead. A
-- queue partition leaves one dead row version per message (pending, then
-- sent or processed) and keeps growing all day, or for ever in the default
-- partition when no retention drops partitions: vacuum then waits for ever
-- more dead rows, and the heap and the due indexes grow instead of reusing
-- their space (bench/vacuum.ts). Here: vacuum after 10,000 dead rows, and
-- after 100,000 inserts (the inbox's rows are mostly inserted once), whatever
-- the size. ALTER TABLE … SET takes SHARE UPDATE EXCLUSIVE: enqueues, claims
-- and marks go on while it runs.
DO $$
DECLARE
  part regclass;
BEGIN
  FOR part IN
    SELECT c.oid::regclass FROM pg_class c
    WHERE c.relkind = 'r'
      AND (c.oid IN (SELECT inhrelid FROM pg_inherits
                     WHERE inhparent IN ('outbox'::regclass, 'inbox'::regclass))
           OR c.oid IN ('outbox'::regclass, 'inbox'::regclass))
  LOOP
    EXECUTE format('ALTER TABLE %s SET (autovacuum_vacuum_scale_factor = 0, '
                   'autovacuum_vacuum_threshold = 10000, autovacuum_vacuum_insert_scale_factor = 0, '
                   'autovacuum_vacuum_insert_threshold = 100000)', part);
  END LOOP;
END
$$;
