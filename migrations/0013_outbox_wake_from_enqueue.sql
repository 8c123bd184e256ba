-- txbox 0013: the relays' wake-up moves from a trigger into enqueue.
-- The statement-level trigger of 0001/0007 ran on every INSERT: a PL/pgSQL
-- call with its `SET search_path` and two index probes, about a quarter of
-- the server's cost of a one-row enqueue transaction (bench/cost.ts with
-- pg_stat_statements). `Outbox.enqueue` now calls outbox_wake() in its
-- INSERT's statement, and after an answer of "a relay is warm" leaves it out
-- for 25 ms in that process (storage/sql/enqueue.ts): at a steady load a few
-- statements in a hundred ask. Rows written with SQL of your own no longer
-- wake a relay: the relay's next look or poll (`pollInterval`) finds them.
DROP TRIGGER outbox_notify ON outbox;
DROP FUNCTION outbox_notify();

-- 0007's question, asked by the caller: NOTIFY the relays unless one is warm
-- (published within the last 50 ms: it looks again by itself) or a committed
-- row is due and unclaimed (a relay is about to look). True when it notified.
-- PL/pgSQL keeps the probes' plans for the session; a plain SQL statement
-- would be planned on every call (over 0.3 ms here).
CREATE FUNCTION outbox_wake() RETURNS boolean LANGUAGE plpgsql
SET search_path FROM CURRENT AS $$
DECLARE
  -- A variable, not the expression: a volatile function in the condition
  -- would rule out the index and scan every sent row. clock_timestamp(), not
  -- now(): a long producer transaction must not take an old publish for a
  -- recent one.
  recent timestamptz := clock_timestamp() - interval '50 milliseconds';
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
