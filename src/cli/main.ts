#!/usr/bin/env node
/**
 * The `txbox` command: migrate, status, dead list|redrive|skip, purge,
 * partitions, reconcile; with
 * no database, contracts check and asyncapi; on RabbitMQ, topology declare.
 *
 * Exit codes: 0 done; 1 the database failed or is not migrated, or a contract
 * check found an incompatible change; 2 the command line or configuration is
 * wrong. A failure is one line on stderr, with any URL's credentials redacted,
 * never a stack trace.
 */
import { readFileSync } from "node:fs"
import { Cause, Effect, Exit, Layer } from "effect"
import { CliConfig, CliError, CliOutput, Command, GlobalFlag } from "effect/cli"
import { redactUrls } from "../Errors.ts"
import * as asyncapi from "./asyncapi.ts"
import * as contracts from "./contracts.ts"
import * as dead from "./dead.ts"
import { describeFailure, EXIT_USAGE } from "./errors.ts"
import * as migrate from "./migrate.ts"
import * as partitions from "./partitions.ts"
import * as platform from "./platform.ts"
import * as purge from "./purge.ts"
import * as reconcile from "./reconcile.ts"
import * as status from "./status.ts"
import * as topology from "./topology.ts"
import * as wal from "./wal.ts"

// package.json sits two levels up from both src/cli/main.ts and dist/cli/main.js.
const version = (): string => {
  try {
    return (
      JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8")).version ?? "unknown"
    )
  } catch {
    return "unknown"
  }
}

const txbox = Command.make("txbox").pipe(
  Command.withDescription(
    "Operate txbox's outbox and inbox tables on PostgreSQL; check and describe event contracts; declare RabbitMQ topology",
  ),
  Command.withExamples([
    { command: "txbox migrate --url postgres://app@db/app", description: "create or upgrade the tables" },
    { command: "txbox status --json", description: "backlog and lag for a monitor (URL from $DATABASE_URL)" },
    { command: "txbox dead list --type orders.order-placed --since 2h", description: "what died lately" },
    {
      command: "txbox dead redrive --type orders.order-placed --dry-run",
      description: "how many would go again",
    },
    { command: "txbox purge --older-than 14d", description: "retention for sent and processed rows" },
    {
      command: "txbox reconcile --consumer billing --since 2d --grace 10m",
      description: "what billing was owed against what it applied, per day × type × tenant",
    },
    {
      command: "txbox partitions drop --older-than 14d",
      description: "retention by dropping whole day partitions",
    },
    {
      command: "txbox wal status",
      description: "the WAL relay's slot: read or not, and the WAL it keeps",
    },
    {
      command: "txbox contracts check --old ./released/contracts.ts --new ./src/contracts.ts",
      description: "does the new contract module break old producers or consumers?",
    },
    {
      command: "txbox asyncapi --module ./src/contracts.ts --consumer billing --out asyncapi.json",
      description: "an AsyncAPI 3.0 document of the contracts",
    },
    {
      command: "txbox topology declare --url amqp://rabbitmq --consumer billing --type orders.order-placed",
      description: "a consumer's queue and bindings, before its producer publishes",
    },
  ]),
  Command.withSubcommands([
    migrate.command,
    status.command,
    dead.command,
    purge.command,
    partitions.command,
    reconcile.command,
    contracts.command,
    asyncapi.command,
    topology.command,
    wal.command,
  ]),
)

// Parse errors become one line on stderr (printed below) instead of the whole
// help page: the page is one `--help` away, and a script's log stays readable.
const presenter = CliOutput.layerPresenter({
  present: (event) =>
    event._tag === "InvalidInvocation" ? Effect.void : CliOutput.defaultPresenter.present(event),
})

// Only --help and --version: the wizard and shell completions would need a
// terminal and files this platform layer does not give them.
const config = CliConfig.layer({ builtIns: [GlobalFlag.Help, GlobalFlag.Version] })

const failureOf = (error: unknown): { readonly line: string; readonly exitCode: number } => {
  if (CliError.isCliError(error)) {
    if (error._tag === "ShowHelp") {
      // No errors: `txbox` or `txbox dead` alone, and the help was printed.
      if (error.errors.length === 0) return { line: "", exitCode: EXIT_USAGE }
      const path = error.commandPath.join(" ")
      const what = error.errors.map((e) => e.message).join("; ")
      return { line: redactUrls(`${what} (see \`${path} --help\`)`), exitCode: EXIT_USAGE }
    }
    return { line: redactUrls(error.message), exitCode: EXIT_USAGE }
  }
  return describeFailure(error)
}

const program = Command.runWith(txbox, { version: version() })(process.argv.slice(2)).pipe(
  Effect.provide(Layer.mergeAll(platform.layer, presenter, config)),
)

const exit = await Effect.runPromiseExit(program)
if (Exit.isFailure(exit)) {
  const failure = Cause.hasInterruptsOnly(exit.cause)
    ? { line: "interrupted", exitCode: 130 }
    : failureOf(Cause.squash(exit.cause))
  if (failure.line !== "") process.stderr.write(`txbox: ${failure.line}\n`)
  process.exitCode = failure.exitCode
}
