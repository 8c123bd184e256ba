-- txbox 0017: outbox_wake()'s look for a due, unclaimed row reads only the
-- last three seconds of `outbox_due`.
-- It walked the index from its oldest entry. Every row marked sent leaves a
-- dead entry there until vacuum removes it, and while any transaction holds
-- an old snapshot neither vacuum nor the scans may remove one: the walk then
-- stepped over every row sent since that snapshot began, on the producer's
-- commit path (issue #26). A due row older than three seconds is left out:
-- the producer then sends a NOTIFY it could have spared, which costs a
-- wake-up, never a message (relays look for old rows in their full claims,
-- storage/sql/claimWindow.ts).
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
     OR EXISTS (SELECT 1 FROM outbox WHERE status = 'pending' AND visible_at < now()
                  AND visible_at >= now() - interval '3 seconds') THEN
    RETURN false;
  END IF;
  PERFORM pg_notify(current_schema() || '.outbox', '');
  RETURN true;
END
$$;
