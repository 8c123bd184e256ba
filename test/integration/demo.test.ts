// `npm run demo` as a user runs it: a child process, judged by its exit code and its output.
import { describe, expect, test } from "bun:test"
import { spawn } from "node:child_process"

interface Run {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

const runDemo = (args: ReadonlyArray<string>, env: Record<string, string | undefined>) =>
  new Promise<Run>((resolve, reject) => {
    // Start from this environment without the URLs a developer's shell may hold, then add the test's own.
    const { DATABASE_URL: _db, AMQP_URL: _amqp, ...base } = process.env
    const child = spawn(process.execPath, ["demo/demo.ts", ...args], {
      env: { ...base, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (d) => (stdout += d))
    child.stderr.on("data", (d) => (stderr += d))
    child.on("error", reject)
    child.on("exit", (code) => resolve({ code, stdout, stderr }))
  })

describe("the demo", () => {
  test("on the embedded default (PGlite + in-memory broker) it reports exactly once and exits 0", async () => {
    const run = await runDemo(["--orders", "200"], {})
    expect(run.stdout).toContain("exactly once: yes")
    expect(run.stdout).toMatch(/orders placed\s+200/)
    expect(run.code).toBe(0)
  })

  test("an unreachable DATABASE_URL is one line on stderr, exit 2, and the password never shows", async () => {
    const run = await runDemo(["--orders", "10"], { DATABASE_URL: "postgres://nobody:secret@127.0.0.1:1/x" })
    expect(run.code).toBe(2)
    const lines = run.stderr.trim().split("\n")
    expect(lines).toHaveLength(1)
    expect(lines[0]).toContain("PostgreSQL (DATABASE_URL)")
    expect(lines[0]).toContain("ECONNREFUSED")
    expect(run.stdout).toBe("")
    expect(run.stdout + run.stderr).not.toContain("secret")
  })

  test("a bad --orders is a usage line and exit 2", async () => {
    const run = await runDemo(["--orders", "many"], {})
    expect(run.code).toBe(2)
    expect(run.stderr.trim()).toMatch(/^demo: usage: /)
  })
})
