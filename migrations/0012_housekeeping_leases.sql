-- txbox 0012: housekeeping run by one process at a time.
--
-- Every relay process ran the lag probe (a read of the front of outbox_due
-- every few seconds) and the retention pass (batched DELETEs): with twenty
-- relays, twenty probes and twenty purges doing one job. A task is now held
-- by one process under a lease row: taken when free or when its holder's
-- lease ran out (a holder that died), renewed by its holder each time it runs
-- the task. A row, not an advisory lock: it holds through a transaction
-- pooler (PgBouncer), where a session lock would stick to a server
-- connection some other client then uses.
CREATE TABLE housekeeping_leases (
  task       text        PRIMARY KEY,
  -- The holding process's id (a UUID each relay draws at start).
  holder     text        NOT NULL,
  held_until timestamptz NOT NULL
);
