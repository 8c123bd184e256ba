/** Printing: aligned tables for people, JSON for machines. Everything goes through effect's `Console`. */
import { Console, type Effect } from "effect"

export type Align = "left" | "right"

/**
 * Pads columns to their widest cell. Numbers read best right-aligned, text
 * left; the last column is not padded so a long error message does not drag
 * trailing spaces along.
 */
export const table = (
  headers: ReadonlyArray<string>,
  rows: ReadonlyArray<ReadonlyArray<string>>,
  align: ReadonlyArray<Align> = [],
): string => {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? "").length)))
  const line = (cells: ReadonlyArray<string>) =>
    cells
      .map((cell, i) => {
        if (i === cells.length - 1 && align[i] !== "right") return cell
        const width = widths[i] ?? 0
        return align[i] === "right" ? cell.padStart(width) : cell.padEnd(width)
      })
      .join("  ")
      .trimEnd()
  return [line(headers), ...rows.map(line)].join("\n")
}

/** One line of free text: newlines collapsed, cut at `max` characters with an ellipsis. */
export const oneLine = (text: string | null, max: number): string => {
  if (text === null) return "-"
  const flat = text.replace(/\s+/g, " ").trim()
  return flat.length > max ? `${flat.slice(0, max - 1)}…` : flat
}

export const print = (text: string): Effect.Effect<void> => Console.log(text)

/** Indented JSON: dates become ISO strings, counts stay numbers. */
export const printJson = (value: unknown): Effect.Effect<void> => Console.log(JSON.stringify(value, null, 2))
