// What a wake-up costs a process here: the CPU a JavaScript process is charged (getrusage) for
// sleeping on a timer and waking, and for a PostgreSQL round trip (`SELECT 1` on node-postgres)
// made back to back or after such a sleep, with the server's backend beside it (/proc). On the
// 2-core VM of the benches the second figure grows with the sleep before it (caches gone cold,
// the hypervisor's way back from idle: not told apart here). So a process that wakes 40 times a
// second for a little work each time pays more per message than one that wakes 20 times for twice
// as much: the relay's looks (bench/cost.ts), a producer at a low rate.
//
//   bun bench/wake.ts [--quick] [--gaps 0,1,5,25] [--seconds 3]      (node bench/wake.ts works too)
import { readFileSync } from "node:fs"
import pg from "pg"
import { startLocalPostgres } from "../test/support/postgres.ts"
import { log, main, parseArgs, printTable, round, writeResult } from "./support/harness.ts"

const args = parseArgs()
const config = {
  gaps: args
    .string("gaps", "0,1,5,25")
    .split(",")
    .map((g) => Number(g.trim())),
  seconds: args.number("seconds", args.quick ? 0.5 : 3),
}

const runtime = typeof Bun === "undefined" ? `node ${process.version}` : `bun ${Bun.version}`
/** This process's CPU (user + system), µs. */
const selfCpu = () => {
  const u = process.cpuUsage()
  return u.user + u.system
}
/** A process's CPU from /proc, µs (clock ticks: 10 ms each, so read over many round trips). */
const procCpu = (pid: number) => {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ")
  return (Number(fields[11]) + Number(fields[12])) * 10_000
}
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

main(async () => {
  const server = await startLocalPostgres({ name: "wake" })
  const client = new pg.Client({ connectionString: server.url })
  try {
    await client.connect()
    const backend = Number(
      (await client.query<{ pid: number }>("SELECT pg_backend_pid() AS pid")).rows[0]!.pid,
    )
    const rows: Array<Array<string | number>> = []
    const summary: Record<string, number> = {}
    for (let i = 0; i < 200; i++) await client.query("SELECT 1")
    for (const gap of config.gaps) {
      // As many as fit in the time given, with a few hundred at least for the ticks of /proc.
      const n = Math.max(gap === 0 ? 2000 : 40, Math.round((config.seconds * 1000) / Math.max(gap, 0.1)))
      let timerUs: number | undefined
      if (gap > 0) {
        const before = selfCpu()
        for (let i = 0; i < n; i++) await sleep(gap)
        timerUs = (selfCpu() - before) / n
      }
      const before = selfCpu()
      const backendBefore = procCpu(backend)
      for (let i = 0; i < n; i++) {
        if (gap > 0) await sleep(gap)
        await client.query("SELECT 1")
      }
      const roundTripUs = (selfCpu() - before) / n - (timerUs ?? 0)
      const backendUs = (procCpu(backend) - backendBefore) / n
      rows.push([
        gap === 0 ? "back to back" : `${gap} ms`,
        n,
        timerUs === undefined ? "–" : Math.round(timerUs),
        Math.round(roundTripUs),
        Math.round(backendUs),
      ])
      if (timerUs !== undefined) summary[`timer_wake_us_${gap}ms`] = round(timerUs, 1)
      summary[`round_trip_us_${gap}ms`] = round(roundTripUs, 1)
      summary[`backend_us_${gap}ms`] = round(backendUs, 1)
    }
    printTable(
      `CPU µs charged per wake-up (${runtime}): a timer's sleep and wake, and a round trip of SELECT 1 on top of it (client), and its backend's`,
      ["sleep before", "times", "timer wake µs", "round trip µs", "backend µs"],
      rows,
    )
    log("a round trip after a sleep costs its client more than one back to back: the wake-up's share")
    writeResult("wake", args, undefined, { summary, config, results: rows })
  } finally {
    await client.end().catch(() => {})
    await server.stop()
  }
})
