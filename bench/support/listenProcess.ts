// A LISTEN connection in a process of its own, standing in for a relay that waits for NOTIFY:
// the notifications cost the server (and this process) what they cost in production, and nothing
// in the process being measured. Prints {"event":"ready"}, then {"event":"stats", notifications}
// every STATS_MS.
//
// env: DB_URL, CHANNEL, STATS_MS (default 1000)
import postgres from "postgres"

const url = process.env.DB_URL
const channel = process.env.CHANNEL
if (!url || !channel) throw new Error("DB_URL and CHANNEL are required")
const sql = postgres(url, { max: 1, onnotice: () => {} })
let notifications = 0
await sql.listen(channel, () => {
  notifications++
})
const emit = (event: string) => process.stdout.write(`${JSON.stringify({ event, notifications })}\n`)
emit("ready")
setInterval(() => emit("stats"), Number(process.env.STATS_MS ?? "1000"))
const stop = async () => {
  await sql.end({ timeout: 2 })
  process.exit(0)
}
process.on("SIGTERM", () => void stop())
process.stdin.on("end", () => void stop())
process.stdin.resume()
