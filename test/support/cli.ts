// The `txbox` command as an operator runs it, for the tests that judge it by its output and exit code.
import { spawn } from "node:child_process"
import { fileURLToPath } from "node:url"

const MAIN = fileURLToPath(new URL("../../src/cli/main.ts", import.meta.url))

export interface CliRun {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/**
 * `bun src/cli/main.ts ...args` in a child process. The variables named in `unset` are not
 * inherited (a test that means "no URL given" must not pick one up from the environment); `env`
 * adds its own.
 */
export const runTxbox = (
  args: ReadonlyArray<string>,
  { env = {}, unset = [] }: { env?: Record<string, string>; unset?: ReadonlyArray<string> } = {},
): Promise<CliRun> =>
  new Promise((resolve, reject) => {
    const inherited = Object.fromEntries(Object.entries(process.env).filter(([k]) => !unset.includes(k)))
    const child = spawn(process.execPath, [MAIN, ...args], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...inherited, NO_COLOR: "1", ...env },
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (d) => (stdout += d))
    child.stderr.on("data", (d) => (stderr += d))
    child.on("error", reject)
    child.on("close", (code) => resolve({ code, stdout, stderr }))
  })
