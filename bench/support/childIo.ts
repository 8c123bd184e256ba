// The bench's side of a child process (relayProcess.ts, inboxProcess.ts, producerProcess.ts and the
// hand-written pipeline's children): its environment, its JSON lines to the parent, and the
// commands the parent sends on stdin.

export const env = (name: string, fallback?: string): string => {
  const value = process.env[name] ?? fallback
  if (value === undefined || value === "") throw new Error(`${name} is required`)
  return value
}

export const emit = (event: Record<string, unknown>): void => {
  process.stdout.write(`${JSON.stringify(event)}\n`)
}

export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms))

/** Calls `onLine` for each stdin line; `stop` on a "stop" line, SIGTERM, or the parent going away. */
export const onCommands = (onLine: (line: string) => void, stop: () => unknown): void => {
  process.on("SIGTERM", () => void stop())
  let buffered = ""
  process.stdin.setEncoding("utf8")
  process.stdin.on("data", (chunk: string) => {
    buffered += chunk
    let nl = buffered.indexOf("\n")
    while (nl >= 0) {
      const line = buffered.slice(0, nl).trim()
      buffered = buffered.slice(nl + 1)
      if (line === "stop") void stop()
      else onLine(line)
      nl = buffered.indexOf("\n")
    }
  })
  process.stdin.on("end", () => void stop())
}
