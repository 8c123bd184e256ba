/**
 * The services `effect/cli` asks for (`Command.Environment`), built from
 * effect's own modules over `process`. The commands read no files, spawn no
 * processes and never prompt, so those services refuse; what remains is
 * arguments, stdout/stderr and the terminal width. This keeps the bin free of
 * `@effect/platform-node` (and its dependencies) and lets the same file run
 * on Node, Bun and Deno.
 */
import { Effect, FileSystem, Layer, Path, Sink, Stdio, Stream, Terminal } from "effect"
import type { Command } from "effect/cli"
import { ChildProcessSpawner } from "effect/process"

const write = (stream: NodeJS.WriteStream) =>
  // biome-ignore lint/suspicious/useIterableCallbackReturn: Sink.forEach takes an effect per chunk, not Array.forEach
  Sink.forEach((chunk: string | Uint8Array) => Effect.sync(() => void stream.write(chunk)))

const stdio = Stdio.make({
  args: Effect.sync(() => process.argv.slice(2)),
  stdout: () => write(process.stdout),
  stderr: () => write(process.stderr),
  stdin: Stream.empty,
  stdinIsTerminal: Effect.sync(() => process.stdin.isTTY === true),
  stdoutIsTerminal: Effect.sync(() => process.stdout.isTTY === true),
  stderrIsTerminal: Effect.sync(() => process.stderr.isTTY === true),
})

const unsupported = (what: string) => Effect.die(new Error(`txbox: ${what} is not supported by this command`))

const terminal = Terminal.make({
  columns: Effect.sync(() => process.stdout.columns ?? 80),
  rows: Effect.sync(() => process.stdout.rows ?? 24),
  size: unsupported("terminal resize events"),
  readInput: unsupported("interactive input"),
  readLine: unsupported("interactive input"),
  display: (text) => Effect.sync(() => void process.stdout.write(text)),
})

/** Everything `Command.runWith` needs, for a process that only parses flags and prints. */
export const layer: Layer.Layer<Command.Environment> = Layer.mergeAll(
  FileSystem.layerNoop({}),
  Path.layer,
  Layer.succeed(Stdio.Stdio, stdio),
  Layer.succeed(Terminal.Terminal, terminal),
  Layer.succeed(
    ChildProcessSpawner.ChildProcessSpawner,
    ChildProcessSpawner.make(() => unsupported("spawning processes")),
  ),
)
