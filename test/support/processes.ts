// Child processes for tests that kill things: spawn a fixture with Bun, wait for its ready line.
import { type ChildProcess, spawn } from "node:child_process"

export interface Child {
  readonly process: ChildProcess
  readonly output: () => string
  readonly exited: Promise<number | null>
  readonly kill: (signal?: NodeJS.Signals) => Promise<number | null>
}

export const startFixture = async (
  script: string,
  env: Record<string, string>,
  readyLine = "started",
  timeoutMs = 20_000,
): Promise<Child> => {
  const child = spawn(process.execPath, [script], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  })
  let output = ""
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)))
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`${script} not ready in ${timeoutMs} ms:\n${output}`)),
      timeoutMs,
    )
    const onData = (d: Buffer) => {
      output += d.toString()
      if (output.includes(readyLine)) {
        clearTimeout(timer)
        resolve()
      }
    }
    child.stdout!.on("data", onData)
    child.stderr!.on("data", onData)
    child.on("exit", (code) => {
      clearTimeout(timer)
      reject(new Error(`${script} exited with ${code} before it was ready:\n${output}`))
    })
  })
  return {
    process: child,
    output: () => output,
    exited,
    kill: async (signal = "SIGTERM") => {
      if (child.exitCode === null && child.signalCode === null) child.kill(signal)
      return exited
    },
  }
}
