-- txbox 0020: the relay's three statements per batch as functions, whose plans
-- each connection keeps (issues #21, #25).
-- A statement sent as text is planned anew every time, and on the partitioned
-- outbox (0015) planning cost more than running: the held claim 115 µs to plan
-- and 186 µs to run, the last-publish probe 52 and 9, the mark of a batch
-- about 230 µs to plan (bench/cost.ts, BENCH_PG_STATEMENTS). In a PL/pgSQL
-- function a statement is planned once per connection and kept, with nothing
-- the client holds (no named prepared statement: PgBouncer in transaction mode
-- is fine). The relay calls these when it claims without a shard; sharded
-- claims, per-row verdicts and the leased claim keep their statements.
-- Code of the previous version does not call them; this version needs them
-- (a relay on a schema without them says to run `txbox migrate`).
--
-- The bodies name the schema, written in here when the migration runs
-- (format's %1$I: the schema it runs in), rather than a `SET search_path`
-- clause: that clause costs every call a configuration change and back, which
-- took a quarter of the mark's time (backend CPU per batch of 25: 255 µs
-- without it, 290 µs with it, 400 µs as text).
DO $do$
BEGIN
  -- The held claim (storage/sql/heldClaims.ts): due rows locked with SKIP
  -- LOCKED in the caller's transaction, none written; the transaction's
  -- idle_in_transaction_session_timeout becomes p_idle (local to the
  -- transaction, not to the function), so a relay stuck between two
  -- statements is cut off and its rows come back. p_since_ms: how far back
  -- the claim looks (storage/sql/claimWindow.ts).
  EXECUTE format($f$
    CREATE FUNCTION %1$I.outbox_claim_held(p_limit integer, p_idle text, p_since_ms double precision)
    RETURNS TABLE (
      id uuid, type text, version integer, payload text, headers jsonb, routing_key text,
      partition_key text, partition_epoch double precision, partition_seq double precision,
      tenant_id text, lease_until text, occurred_at timestamptz, attempts integer
    ) LANGUAGE plpgsql AS $$
    #variable_conflict use_column
    BEGIN
      PERFORM set_config('idle_in_transaction_session_timeout', p_idle, true);
      RETURN QUERY
        SELECT o.id, o.type, o.version, o.payload::text, o.headers, o.routing_key, o.partition_key,
               o.partition_epoch::double precision, o.partition_seq::double precision, o.tenant_id,
               o.visible_at::text, o.occurred_at, o.attempts
        FROM %1$I.outbox o
        WHERE o.status = 'pending' AND o.visible_at <= now()
          AND o.visible_at >= now() - p_since_ms * interval '1 millisecond'
        ORDER BY o.visible_at
        LIMIT p_limit
        FOR UPDATE OF o SKIP LOCKED;
    END
    $$
  $f$, current_schema());

  -- The last row any relay marked sent: how long before this statement, and
  -- under which claim's token (the relays' cover, core/relayCycle.ts).
  EXECUTE format($f$
    CREATE FUNCTION %1$I.outbox_last_published()
    RETURNS TABLE (last_published_ago_ms double precision, last_token text)
    LANGUAGE plpgsql STABLE AS $$
    BEGIN
      RETURN QUERY
        SELECT (extract(epoch FROM statement_timestamp() - o.published_at) * 1000)::double precision,
               o.lock_token::text
        FROM %1$I.outbox o WHERE o.status = 'sent' ORDER BY o.published_at DESC LIMIT 1;
    END
    $$
  $f$, current_schema());

  -- A held claim's rows (a JSON array of ids) marked sent, all of them, where
  -- still pending; the claim's token stays on them. Answers how many.
  EXECUTE format($f$
    CREATE FUNCTION %1$I.outbox_mark_held_sent(p_ids text, p_token uuid)
    RETURNS integer LANGUAGE plpgsql AS $$
    DECLARE
      marked integer;
    BEGIN
      UPDATE %1$I.outbox o SET status = 'sent', published_at = statement_timestamp(), lock_token = p_token
      WHERE o.id = ANY (ARRAY(SELECT value::uuid FROM json_array_elements_text(p_ids::json)))
        AND o.status = 'pending';
      GET DIAGNOSTICS marked = ROW_COUNT;
      RETURN marked;
    END
    $$
  $f$, current_schema());
END
$do$;
