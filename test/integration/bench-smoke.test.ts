// The bench scripts stay runnable: each one with --quick, as a child process on the services the
// preload started (it inherits TXBOX_TEST_DATABASE_URL / TXBOX_TEST_AMQP_URL), must exit 0 and
// write its result file with a summary of numbers. No timing is asserted: figures from a shared,
// busy test machine mean nothing, and a smoke test must not flake on them.
import { afterAll, describe, expect, test } from "bun:test"
import { spawn } from "node:child_process"
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"

const benchDir = join(import.meta.dir, "..", "..", "bench")
// Results go to a temp dir, so `bun test` never overwrites the results of a real run.
const resultsDir = mkdtempSync(join(tmpdir(), "txbox-bench-smoke-"))
afterAll(() => rmSync(resultsDir, { recursive: true, force: true }))

const runQuick = (script: string, extra: ReadonlyArray<string> = []) =>
  new Promise<{ code: number | null; output: string }>((resolve) => {
    const child = spawn(process.execPath, [join(benchDir, `${script}.ts`), "--quick", ...extra], {
      env: { ...process.env, TXBOX_BENCH_RESULTS_DIR: resultsDir },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let output = ""
    child.stdout!.on("data", (d: Buffer) => {
      output += d.toString()
    })
    child.stderr!.on("data", (d: Buffer) => {
      output += d.toString()
    })
    child.on("exit", (code) => resolve({ code, output }))
  })

const expectResult = (name: string) => {
  const path = join(resultsDir, `${name}.json`)
  expect(existsSync(path)).toBe(true)
  const file = JSON.parse(readFileSync(path, "utf8")) as {
    name: string
    quick: boolean
    summary: Record<string, unknown>
  }
  expect(file.name).toBe(name)
  expect(file.quick).toBe(true)
  const values = Object.values(file.summary)
  expect(values.length).toBeGreaterThan(0)
  for (const [key, value] of Object.entries(file.summary)) {
    expect({ key, finite: typeof value === "number" && Number.isFinite(value) }).toEqual({
      key,
      finite: true,
    })
  }
}

describe("bench scripts --quick", () => {
  for (const name of [
    "relay",
    "latency",
    "inbox",
    "enqueue",
    "memory",
    "scaleout",
    "ordered",
    "blocked",
    "e2e",
    "cost",
    "profile",
    "builder",
    "retention",
    "idle",
    "walsender",
    "wake",
    "vacuum",
    "snapshot",
  ]) {
    test(name, async () => {
      const { code, output } = await runQuick(name)
      if (code !== 0) console.error(output)
      expect(code).toBe(0)
      expectResult(name)
    }, 240_000)
  }

  // The WAL relay's pipeline in cost.ts: its own server settings (wal_level, synchronous_commit) and the slot dropped after.
  test("cost, txbox-wal", async () => {
    const { code, output } = await runQuick("cost", [
      "--pipelines",
      "txbox-wal",
      "--loads",
      "max",
      "--topologies",
      "1+1",
      "--sync-commit",
      "on",
    ])
    if (code !== 0) console.error(output)
    expect(code).toBe(0)
    expectResult("cost")
    // Of PostgreSQL's CPU, the WAL sender's: read from /proc for the slot's reader.
    const { summary } = JSON.parse(readFileSync(join(resultsDir, "cost.json"), "utf8")) as {
      summary: Record<string, number>
    }
    expect(Object.keys(summary).filter((key) => key.startsWith("txbox-wal_cpu_walsender_"))).toHaveLength(1)
    expect(output).toContain("its WAL sender")
  }, 240_000)

  // relay.ts --source wal: a server of its own with wal_level = logical, the backlog written after the
  // slot exists, and the slot dropped after each drain (issue #27).
  test("relay --source wal", async () => {
    const { code, output } = await runQuick("relay", ["--source", "wal"])
    if (code !== 0) console.error(output)
    expect(code).toBe(0)
    expectResult("relay-wal")
  }, 240_000)

  // e2e.ts --sources polling,wal: each pass with both relays, and the table of the two.
  test("e2e --sources polling,wal", async () => {
    const { code, output } = await runQuick("e2e", ["--sources", "polling,wal", "--settings", "durable"])
    if (code !== 0) console.error(output)
    expect(code).toBe(0)
    expect(output).toContain("The WAL relay against the polling relay")
    expectResult("e2e")
    const { summary } = JSON.parse(readFileSync(join(resultsDir, "e2e.json"), "utf8")) as {
      summary: Record<string, number>
    }
    // Both relays' figures: the WAL relay's under keys of their own.
    expect(Object.keys(summary).some((key) => key.startsWith("durable.wal."))).toBe(true)
    expect(Object.keys(summary).some((key) => key.startsWith("durable.100."))).toBe(true)
  }, 240_000)

  // all.ts runs the others; one of them is enough to check the orchestration and the combined summary.
  test("all (orchestration, with --only)", async () => {
    const { code, output } = await runQuick("all", ["--only", "enqueue"])
    if (code !== 0) console.error(output)
    expect(code).toBe(0)
    expectResult("all")
  }, 240_000)
})
