// Chooses where the integration tests' PostgreSQL and RabbitMQ come from, per service:
// a URL from the environment, else testcontainers when a Docker engine answers, else local binaries.
// Never skips: when none works, the error says what to install.
import { existsSync, readFileSync } from "node:fs"
import http from "node:http"
import https from "node:https"
import { homedir } from "node:os"
import { join } from "node:path"
import { POSTGRES_INSTALL_HINT, startLocalPostgres } from "./postgres.ts"
import { RABBITMQ_INSTALL_HINT, startLocalRabbit } from "./rabbitmq.ts"

export type ServiceSource = "env" | "testcontainers" | "local"

export interface Services {
  readonly databaseUrl: string
  readonly amqpUrl: string
  /** Per service, since each is chosen on its own (a URL may be given for one only). */
  readonly source: { readonly database: ServiceSource; readonly amqp: ServiceSource }
  /** Stops what was started here; URLs from the environment are left alone. Safe to call twice. */
  stop(): Promise<void>
  /** Synchronous best effort for process exit hooks: kills local servers (containers have Ryuk). */
  stopSync(): void
}

interface Started {
  readonly url: string
  readonly source: ServiceSource
  stop(): Promise<void>
  stopSync(): void
}

const noop = { stop: async () => {}, stopSync: () => {} }

/** Where a Docker engine could be: DOCKER_HOST, testcontainers' own setting, the usual sockets. */
function dockerEndpoints(): string[] {
  const endpoints: string[] = []
  if (process.env.DOCKER_HOST) endpoints.push(process.env.DOCKER_HOST)
  try {
    const properties = readFileSync(join(homedir(), ".testcontainers.properties"), "utf8")
    const host = /^docker\.host\s*=\s*(\S+)/m.exec(properties)?.[1]
    if (host) endpoints.push(host)
  } catch {}
  const uid = process.getuid?.()
  const sockets = [
    "/var/run/docker.sock",
    process.env.XDG_RUNTIME_DIR ? join(process.env.XDG_RUNTIME_DIR, "docker.sock") : "",
    uid === undefined ? "" : `/run/user/${uid}/docker.sock`,
    join(homedir(), ".docker/run/docker.sock"),
    join(homedir(), ".docker/desktop/docker.sock"),
  ]
  for (const socket of sockets) if (socket && existsSync(socket)) endpoints.push(`unix://${socket}`)
  return endpoints
}

/**
 * GET /_ping answers 200 "OK" from a Docker engine. A bare TCP connect proves nothing: some
 * sandboxes accept connections to any address.
 */
function answers(endpoint: string, timeoutMs: number): Promise<boolean> {
  let options: https.RequestOptions
  let client: typeof http | typeof https = http
  if (endpoint.startsWith("unix://")) {
    options = { socketPath: endpoint.slice("unix://".length) }
  } else if (endpoint.startsWith("tcp://")) {
    const url = new URL(endpoint)
    const tls = Boolean(process.env.DOCKER_TLS_VERIFY) || url.port === "2376"
    // Only a probe: testcontainers does the certificate checks when it connects for real.
    options = { host: url.hostname, port: Number(url.port || 2375), rejectUnauthorized: false }
    if (tls) client = https
  } else {
    return Promise.resolve(false)
  }
  return new Promise((resolve) => {
    const request = client.get({ ...options, path: "/_ping", timeout: timeoutMs }, (response) => {
      let body = ""
      response.setEncoding("utf8")
      response.on("data", (chunk: string) => {
        body += chunk
      })
      response.on("end", () => resolve(response.statusCode === 200 && body.trim() === "OK"))
      response.on("error", () => resolve(false))
    })
    request.once("timeout", () => request.destroy())
    request.once("error", () => resolve(false))
  })
}

let dockerProbe: Promise<boolean> | undefined

/** Whether a Docker engine answers, within 1.5 s (this machine has a docker CLI and no engine). */
export function dockerAvailable(): Promise<boolean> {
  dockerProbe ??= (async () => {
    const endpoints = dockerEndpoints()
    if (endpoints.length === 0) return false
    const results = await Promise.all(endpoints.map((endpoint) => answers(endpoint, 1_500)))
    return results.includes(true)
  })()
  return dockerProbe
}

function unavailable(service: string, hint: string, problems: readonly string[]): Error {
  const tried = problems.map((problem) => `  ${problem.replaceAll(`: ${hint}`, "")}`).join("\n")
  return new Error(`no ${service} for the tests: ${hint}\n${tried}`)
}

async function startPostgres(): Promise<Started> {
  const fromEnv = process.env.TXBOX_TEST_DATABASE_URL
  if (fromEnv) return { url: fromEnv, source: "env", ...noop }
  const problems: string[] = []
  if (await dockerAvailable()) {
    try {
      // Imported only here: testcontainers pulls in undici 8, whose import throws on Node 20.
      const { PostgreSqlContainer } = await import("@testcontainers/postgresql")
      const container = await new PostgreSqlContainer("postgres:15-alpine")
        .withDatabase("postgres")
        .withUsername("postgres")
        .withPassword("postgres")
        .withCommand([
          "postgres",
          ...["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
          ...["-c", "max_connections=200"],
        ])
        .start()
      return {
        url: container.getConnectionUri(),
        source: "testcontainers",
        stop: async () => {
          await container.stop()
        },
        stopSync: () => {},
      }
    } catch (error) {
      problems.push(`testcontainers: ${error instanceof Error ? error.message : String(error)}`)
      console.error(`[txbox tests] ${problems.at(-1)}; trying local binaries`)
    }
  }
  try {
    const pg = await startLocalPostgres({ name: "tests" })
    return { url: pg.url, source: "local", stop: pg.stop, stopSync: pg.stopSync }
  } catch (error) {
    problems.push(`local: ${error instanceof Error ? error.message : String(error)}`)
  }
  throw unavailable("PostgreSQL", POSTGRES_INSTALL_HINT, problems)
}

async function startRabbit(): Promise<Started> {
  const fromEnv = process.env.TXBOX_TEST_AMQP_URL
  if (fromEnv) return { url: fromEnv, source: "env", ...noop }
  const problems: string[] = []
  if (await dockerAvailable()) {
    try {
      const { RabbitMQContainer } = await import("@testcontainers/rabbitmq")
      const container = await new RabbitMQContainer("rabbitmq:3.10-alpine").start()
      return {
        url: `amqp://guest:guest@${container.getHost()}:${container.getMappedPort(5672)}`,
        source: "testcontainers",
        stop: async () => {
          await container.stop()
        },
        stopSync: () => {},
      }
    } catch (error) {
      problems.push(`testcontainers: ${error instanceof Error ? error.message : String(error)}`)
      console.error(`[txbox tests] ${problems.at(-1)}; trying local binaries`)
    }
  }
  try {
    const rabbit = await startLocalRabbit()
    return { url: rabbit.url, source: "local", stop: rabbit.stop, stopSync: rabbit.stopSync }
  } catch (error) {
    problems.push(`local: ${error instanceof Error ? error.message : String(error)}`)
  }
  throw unavailable("RabbitMQ", RABBITMQ_INSTALL_HINT, problems)
}

/** Starts (or finds) both services, in parallel. If one fails, the other is stopped before the error. */
export async function resolveServices(): Promise<Services> {
  const [database, amqp] = await Promise.allSettled([startPostgres(), startRabbit()])
  if (database.status === "rejected" || amqp.status === "rejected") {
    const errors: unknown[] = []
    for (const result of [database, amqp]) {
      if (result.status === "fulfilled") await result.value.stop().catch(() => {})
      else errors.push(result.reason)
    }
    if (errors.length === 1) throw errors[0]
    throw new AggregateError(
      errors,
      errors.map((e) => (e instanceof Error ? e.message : String(e))).join("\n\n"),
    )
  }
  let stopped: Promise<void> | undefined
  return {
    databaseUrl: database.value.url,
    amqpUrl: amqp.value.url,
    source: { database: database.value.source, amqp: amqp.value.source },
    stop: () => {
      stopped ??= Promise.all([database.value.stop(), amqp.value.stop()]).then(() => {})
      return stopped
    },
    stopSync: () => {
      database.value.stopSync()
      amqp.value.stopSync()
    },
  }
}
