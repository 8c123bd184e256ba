// The unhandledRejection guard for postgres.js's orphaned type-fetch promise, in real Node processes:
// it drops exactly that rejection and leaves Node's default (the process ends) for everything else.
import { describe, expect, test } from "bun:test"
import { spawnSync } from "node:child_process"
import { join } from "node:path"
import { isPostgresJsConnectionLoss } from "../../src/storage/drivers/postgres-js/lostConnectionRejections.ts"

const ROOT = join(import.meta.dir, "../..")
const run = (env: Record<string, string>) => {
  const r = spawnSync(
    join(ROOT, "node_modules/.bin/node"),
    [join(ROOT, "test/fixtures/lost-connection-guard.ts")],
    {
      env: { ...process.env, ...env },
      encoding: "utf8",
      timeout: 20_000,
    },
  )
  return { code: r.status, alive: r.stdout.includes("alive") }
}

describe("postgres.js lost-connection rejections", () => {
  test("with the guard, a postgres.js connection loss nobody awaited does not end the process", () => {
    expect(run({ GUARD: "1", REJECT: "postgres" })).toEqual({ code: 0, alive: true })
  })
  test("without it, the same rejection ends a Node process (what the guard is for)", () => {
    expect(run({ GUARD: "0", REJECT: "postgres" })).toMatchObject({ alive: false })
  })
  test("with the guard, any other unhandled rejection still ends the process", () => {
    const r = run({ GUARD: "1", REJECT: "other" })
    expect(r.alive).toBe(false)
    expect(r.code).not.toBe(0)
  })
  test("only postgres.js's own connection-loss errors match", () => {
    const lost = Object.assign(new Error("x"), {
      code: "CONNECTION_CLOSED",
      stack: "Error: x\n    at closed (/srv/node_modules/postgres/cjs/src/connection.js:1:1)",
    })
    expect(isPostgresJsConnectionLoss(lost)).toBe(true)
    expect(isPostgresJsConnectionLoss(Object.assign(new Error("x"), { code: "CONNECTION_CLOSED" }))).toBe(
      false,
    )
    expect(
      isPostgresJsConnectionLoss(Object.assign(new Error("x"), { code: "23505", stack: lost.stack })),
    ).toBe(false)
    expect(isPostgresJsConnectionLoss("CONNECTION_CLOSED")).toBe(false)
  })
})
