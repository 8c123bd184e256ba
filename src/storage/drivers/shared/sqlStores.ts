/**
 * From a `Database` (a connection and its transactions) to everything a store
 * adapter provides: the outbox and inbox ports in SQL over it, and the schema
 * setting that `Outbox.enqueue` reads, all from the one `schema` option.
 */
import { Effect, Layer } from "effect"
import { Database, TxboxSchema } from "../../../ports/Database.ts"
import type { TxboxStore } from "../../../ports/stores.ts"
import * as SqlInboxStore from "../../sql/SqlInboxStore.ts"
import * as SqlOutboxStore from "../../sql/SqlOutboxStore.ts"

const schemaFromDatabase: Layer.Layer<never, never, Database> = Layer.effect(
  TxboxSchema,
  Effect.gen(function* () {
    return (yield* Database).schema
  }),
)

/** The SQL stores and the schema setting over `database`, which is provided too. */
export const sqlStores = <E, R>(database: Layer.Layer<Database, E, R>): Layer.Layer<TxboxStore, E, R> =>
  Layer.provideMerge(Layer.mergeAll(SqlOutboxStore.layer, SqlInboxStore.layer, schemaFromDatabase), database)
