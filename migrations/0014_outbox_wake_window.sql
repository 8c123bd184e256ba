-- txbox 0014: a relay counts as warm for 100 ms after it published, not 50.
-- A relay that claimed rows looks again every 50 ms (core/leaseLoop.ts) and
-- marks its batch ~10-20 ms into each look: between two of its publishes
-- there is often a little more than 50 ms, and every commit in that gap sent a
-- NOTIFY, which wakes every relay process for a claim that finds nothing.
-- With several relay processes that was most of their claims (issue #25).
-- The relay keeps looking for 200 ms after its last publish (Relay.ts's
-- HOT_MS), which still covers this window, the producers' 25 ms without the
-- check (storage/sql/enqueue.ts) and commits up to 75 ms after that.
CREATE OR REPLACE FUNCTION outbox_wake() RETURNS boolean LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
  -- A variable, not the expression: a volatile function in the condition
  -- would rule out the index and scan every sent row. clock_timestamp(), not
  -- now(): a long producer transaction must not take an old publish for a
  -- recent one.
  recent timestamptz := clock_timestamp() - interval '100 milliseconds';
BEGIN
  IF EXISTS (SELECT 1 FROM outbox WHERE status = 'sent' AND published_at > recent)
     -- Called after this transaction's INSERT: its own rows have visible_at >= now().
     OR EXISTS (SELECT 1 FROM outbox WHERE status = 'pending' AND visible_at < now()) THEN
    RETURN false;
  END IF;
  PERFORM pg_notify(current_schema() || '.outbox', '');
  RETURN true;
END
$$;
