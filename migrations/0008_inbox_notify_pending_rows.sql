-- txbox 0008: the inbox's NOTIFY trigger runs only for pending rows. 0002's
-- statement trigger kept a transition table of every inserted row and ran a
-- query over it on every INSERT, though an idempotent consumer's rows (one
-- INSERT per delivery, the common case) are processed and never notify. A row
-- trigger with a WHEN clause is decided without calling the function, so those
-- inserts pay nothing; a batch of pending rows notifies once per row, which
-- PostgreSQL folds into one notification per transaction.
CREATE OR REPLACE FUNCTION inbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify(TG_TABLE_SCHEMA || '.inbox', '');
  RETURN NULL;
END
$$;

DROP TRIGGER inbox_notify ON inbox;
CREATE TRIGGER inbox_notify AFTER INSERT ON inbox
  FOR EACH ROW WHEN (NEW.status = 'pending') EXECUTE FUNCTION inbox_notify();
