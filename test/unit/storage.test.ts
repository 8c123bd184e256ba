import { describe, expect, test } from "bun:test"
import { readFileSync } from "node:fs"
import { join } from "node:path"
import { renderMigrationsModule } from "../../scripts/embed-migrations.ts"
import { validateSchemaName } from "../../src/core/identifier.ts"
import { isUuid, uuidv7 } from "../../src/core/uuid.ts"
import { classifyDbError } from "../../src/storage/sql/errors.ts"
import { splitStatements } from "../../src/storage/sql/splitStatements.ts"

describe("schema names", () => {
  test("plain identifiers pass", () => {
    expect(validateSchemaName("txbox")).toBe("txbox")
    expect(validateSchemaName("tenant_42")).toBe("tenant_42")
  })
  test.each(['txbox"; drop table x; --', "Txbox", "1abc", "", "a".repeat(64), "a-b"])(
    "%p is refused with a clear ConfigError",
    (name) => {
      expect(() => validateSchemaName(name)).toThrow(/not a valid identifier/)
    },
  )
})

describe("migrations", () => {
  test("the embedded module matches migrations/*.sql (run `npm run embed-migrations` if not)", () => {
    const committed = readFileSync(
      join(import.meta.dir, "../../src/storage/sql/migrations.generated.ts"),
      "utf8",
    )
    expect(committed).toBe(renderMigrationsModule())
  })
  test("statements split on ; outside strings, comments and $$ bodies", () => {
    const parts = splitStatements(
      "CREATE TABLE a (x text DEFAULT 'a;b'); -- c;\nCREATE FUNCTION f() RETURNS trigger AS $$ BEGIN x; y; END $$ LANGUAGE plpgsql;\n/* ; */",
    )
    expect(parts).toHaveLength(2)
    expect(parts[1]).toContain("BEGIN x; y; END")
  })
})

describe("uuidv7", () => {
  test("ids are valid, version 7, and ordered within a process", () => {
    const ids = Array.from({ length: 5000 }, uuidv7)
    expect(ids.every(isUuid)).toBe(true)
    expect(ids.every((id) => id[14] === "7")).toBe(true)
    expect([...ids].sort()).toEqual(ids)
    expect(new Set(ids).size).toBe(ids.length)
  })
})

describe("database error classification", () => {
  test.each([
    ["57P01", "connection"],
    ["08006", "connection"],
    ["28P01", "connection"],
    ["3D000", "connection"],
    ["ECONNREFUSED", "connection"],
    ["40001", "serialization"],
    ["23505", "constraint"],
    ["42P01", "query"],
  ])("SQLSTATE/code %s is %s", (code, reason) => {
    const error = classifyDbError("op", Object.assign(new Error("x"), { code }))
    expect(error.reason).toBe(reason as never)
    expect(error.retryable).toBe(reason === "connection" || reason === "serialization")
  })
})
