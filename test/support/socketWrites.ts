// Counts the writes a socket makes, for tests that count round trips on a real connection.
type Writer = (...args: unknown[]) => unknown

/**
 * Counts the writes of `target` (a socket, or `net.Socket.prototype` for every socket) while `body`
 * runs: a `_writev` (a corked batch) is one write, and so is a `_write` outside one (Bun's `_writev`
 * calls `_write` with the batch joined).
 */
export const countingSocketWrites = async <A>(
  target: object,
  body: () => Promise<A>,
): Promise<{ writes: number; value: A }> => {
  const socket = target as Record<string, Writer>
  const own = {
    _write: Object.getOwnPropertyDescriptor(socket, "_write"),
    _writev: Object.getOwnPropertyDescriptor(socket, "_writev"),
  }
  const { _write: write, _writev: writev } = socket
  let writes = 0
  let inBatch = false
  socket._write = function (this: unknown, ...args) {
    if (!inBatch) writes++
    return write!.apply(this, args)
  }
  if (writev)
    socket._writev = function (this: unknown, ...args) {
      writes++
      inBatch = true
      try {
        return writev.apply(this, args)
      } finally {
        inBatch = false
      }
    }
  try {
    const value = await body()
    return { writes, value }
  } finally {
    for (const [name, descriptor] of Object.entries(own)) {
      if (descriptor === undefined) delete socket[name]
      else Object.defineProperty(socket, name, descriptor)
    }
  }
}
