import { ConfigError } from "../Errors.ts"

/**
 * Schema names end up in DDL and in NOTIFY channel names, where they cannot be
 * bound as parameters. Rather than trust quoting alone, accept only plain
 * lower-case identifiers (what an unquoted name folds to) within PostgreSQL's
 * 63-byte limit.
 */
const IDENTIFIER = /^[a-z_][a-z0-9_]{0,62}$/

export const validateSchemaName = (name: string): string => {
  if (typeof name !== "string" || !IDENTIFIER.test(name)) {
    throw new ConfigError({
      reason: `schema name ${JSON.stringify(name)} is not a valid identifier (lower-case letters, digits and _, at most 63, not starting with a digit)`,
    })
  }
  return name
}

/** Double-quotes a validated identifier for DDL. */
export const quoteIdent = (name: string): string => `"${validateSchemaName(name)}"`
