// The node-postgres pool's BEGIN sent with a transaction's first statement
// (storage/drivers/pg/beginRides.ts): what goes to the client, in what order. A recording stand-in
// for the client: this is the wrapper's own logic; test/integration/pg-begin-rides.test.ts shows
// it on PostgreSQL.
import { describe, expect, test } from "bun:test"
import { bareWord, beginWithFirstStatement } from "../../src/storage/drivers/pg/beginRides.ts"
import { markOwnText } from "../../src/storage/sql/inline.ts"

const OWN = "SELECT $1::int AS n, $2::text AS t -- begin-rides unit"
markOwnText(OWN)

const recording = () => {
  const sent: Array<ReadonlyArray<unknown>> = []
  const client = {
    query: (...args: ReadonlyArray<unknown>) => {
      sent.push(args)
      const text = String(args[0])
      // A text of several statements is answered with one result each, as node-postgres does.
      const one = (command: string) => ({ command, rowCount: 1, rows: [{ command }] })
      return Promise.resolve(text.includes(";\n") ? [one("BEGIN"), one("SELECT")] : one(text.split(" ")[0]!))
    },
  }
  return { client, sent, rides: beginWithFirstStatement(client) }
}

describe("a transaction's BEGIN goes with its first statement", () => {
  test("txbox's own statement: one text, its values written in; the caller gets the statement's answer", async () => {
    const { client, sent } = recording()
    expect(await client.query("begin", [])).toMatchObject({ command: "BEGIN" })
    expect(sent).toEqual([])
    const answer = await client.query(OWN, [7, "it's"])
    expect(sent).toEqual([[`BEGIN;\nSELECT 7::int AS n, E'it''s'::text AS t -- begin-rides unit`]])
    expect(answer).toMatchObject({ command: "SELECT" })
    await client.query("commit", [])
    expect(sent[1]).toEqual(["commit", []])
  })

  test("any other statement goes as it was, after a BEGIN of its own, in order", async () => {
    const { client, sent } = recording()
    await client.query("begin", [])
    await client.query("INSERT INTO t VALUES ($1)", [1])
    expect(sent).toEqual([["BEGIN"], ["INSERT INTO t VALUES ($1)", [1]]])
  })

  test("an own statement with a value no literal carries goes after a BEGIN of its own", async () => {
    const { client, sent } = recording()
    await client.query("begin", [])
    await client.query(OWN, [7, "nul\0byte"])
    expect(sent).toEqual([["BEGIN"], [OWN, [7, "nul\0byte"]]])
  })

  test("a transaction that sent nothing ends without a word to the server", async () => {
    const { client, sent } = recording()
    await client.query("begin", [])
    expect(await client.query("commit", [])).toMatchObject({ command: "COMMIT" })
    await client.query("begin", [])
    await client.query("rollback", [])
    expect(sent).toEqual([])
  })

  test("a BEGIN not sent when the client is lent again is forgotten (reset)", async () => {
    const { client, sent, rides } = recording()
    await client.query("begin", [])
    rides.reset()
    await client.query(OWN, [1, "x"])
    expect(sent).toEqual([[OWN, [1, "x"]]])
  })

  test("outside a transaction nothing changes", async () => {
    const { client, sent } = recording()
    await client.query(OWN, [1, "x"])
    await client.query("SELECT 1")
    expect(sent).toEqual([[OWN, [1, "x"]], ["SELECT 1"]])
  })

  test("only a short text with no values is a word (every statement passes here: long ones are not copied)", () => {
    expect(bareWord(["begin", []])).toBe("begin")
    expect(bareWord([" COMMIT "])).toBe("commit")
    expect(bareWord(["commit", [1]])).toBeUndefined()
    expect(bareWord([`SELECT 1 -- ${"x".repeat(40)}`])).toBeUndefined()
    expect(bareWord([{ text: "begin" }])).toBeUndefined()
  })
})
