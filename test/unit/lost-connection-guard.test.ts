// The unhandledRejection guard for postgres.js's orphaned type-fetch promise, in real Node processes:
// it drops exactly that rejection and leaves Node's default (the process ends) for everything else.
import { describe, expect, test } from "bun:test"
import { spawnSync } from "node:child_process"
import { join } from "node:path"
import {
  isPostgresJsConnectionLoss,
  isSocketLoss,
} from "../../src/storage/drivers/postgres-js/lostConnectionRejections.ts"

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
  return { code: r.status, alive: r.stdout.includes("alive"), stdout: r.stdout, stderr: r.stderr }
}

describe("postgres.js lost-connection rejections", () => {
  test("with the guard, a postgres.js connection loss nobody awaited does not end the process", () => {
    expect(run({ GUARD: "1", REJECT: "postgres" })).toMatchObject({ code: 0, alive: true })
  })
  test("without it, the same rejection ends a Node process (what the guard is for)", () => {
    expect(run({ GUARD: "0", REJECT: "postgres" })).toMatchObject({ alive: false })
  })
  test("with the guard, a socket's own reset (read ECONNRESET) nobody awaited does not end the process, and is said once", () => {
    const r = run({ GUARD: "1", REJECT: "socket" })
    expect(r.stdout).toContain("code ECONNRESET")
    expect(r).toMatchObject({ code: 0, alive: true })
    expect(r.stderr).toContain("dropped an unhandled socket error")
  })
  test("without it, that socket error ends a Node process", () => {
    const r = run({ GUARD: "0", REJECT: "socket" })
    expect(r.stdout).toContain("code ECONNRESET")
    expect(r.alive).toBe(false)
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
  test("a socket error matches only when no JavaScript frame raised it", () => {
    const reset = { code: "ECONNRESET", syscall: "read" }
    const raw = Object.assign(new Error("read ECONNRESET"), reset, {
      stack: "Error: read ECONNRESET\n    at TCP.onStreamRead (node:internal/stream_base_commons:216:20)",
    })
    expect(isSocketLoss(raw)).toBe(true)
    const thrown = Object.assign(new Error("read ECONNRESET"), reset, {
      stack: "Error: read ECONNRESET\n    at handler (file:///app/src/client.js:10:5)",
    })
    expect(isSocketLoss(thrown)).toBe(false)
    expect(isSocketLoss(Object.assign(new Error("x"), { code: "ECONNRESET" }))).toBe(false)
  })
})
