#!/usr/bin/env node
/**
 * The `txbox` bin: checks the runtime before anything else loads. Effect 4
 * needs Node 22.19 or newer; on an older Node its modules fail to load with an
 * error that says nothing about versions. This file uses nothing newer than
 * Node 12 has, and imports the command only once the check passed.
 */

const NEEDED: readonly [number, number] = [22, 19]

const tooOld = (version: string): boolean => {
  const [major = 0, minor = 0] = version.split(".").map(Number)
  return major < NEEDED[0] || (major === NEEDED[0] && minor < NEEDED[1])
}

const versions = process.versions as NodeJS.ProcessVersions & { bun?: string; deno?: string }
// Bun and Deno report the Node version they are compatible with; their own releases are what count.
if (versions.bun === undefined && versions.deno === undefined && tooOld(versions.node)) {
  process.stderr.write(
    `txbox: needs Node.js ${NEEDED.join(".")} or newer; this is Node.js ${versions.node} (${process.execPath}).\n` +
      "Install Node.js 22.19 or newer (e.g. `nvm install 22`), or run txbox with Bun or Deno.\n",
  )
  process.exit(2)
}

await import("./main.ts")
