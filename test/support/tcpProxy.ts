// A loopback TCP proxy a test can cut: `block()` drops every connection and refuses new ones, as if
// the server behind it went away; `unblock()` lets clients reconnect. Used to take the broker (or
// the database) away from the code under test without stopping the shared server.
import net from "node:net"

export interface TcpProxy {
  readonly port: number
  /** `url` with its host:port replaced by the proxy's. */
  readonly urlFor: (url: string) => string
  /** Client connections it carries right now. */
  readonly connections: () => number
  readonly block: () => void
  readonly unblock: () => void
  /**
   * AMQP only: the next `times` connections get a Connection.Close (320, the broker shutting down)
   * right behind the broker's Connection.OpenOk, in the same write, so the client reads both at
   * once: the handshake ends and the connection is closed before the client's code runs again.
   */
  readonly closeRightAfterOpen: (times: number) => void
  readonly close: () => Promise<void>
}

/** AMQP 0-9-1 Connection.OpenOk's method frame starts with these (type 1, channel 0; class 10, method 41 after the size). */
const isOpenOkAt = (data: Buffer, i: number): boolean =>
  data[i] === 1 &&
  data[i + 1] === 0 &&
  data[i + 2] === 0 &&
  data.readUInt16BE(i + 7) === 10 &&
  data.readUInt16BE(i + 9) === 41

/** Where the frame holding Connection.OpenOk ends in `data`, or -1. */
const openOkEnd = (data: Buffer): number => {
  for (let i = 0; i + 11 <= data.length; i++) {
    if (isOpenOkAt(data, i)) {
      const end = i + 7 + data.readUInt32BE(i + 3) + 1
      if (end <= data.length && data[end - 1] === 0xce) return end
    }
  }
  return -1
}

/** Connection.Close(320 CONNECTION_FORCED) as a broker that stops sends it. */
const connectionCloseFrame = (): Buffer => {
  const text = Buffer.from("CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'")
  const payload = Buffer.alloc(4 + 2 + 1 + text.length + 4)
  payload.writeUInt16BE(10, 0)
  payload.writeUInt16BE(50, 2)
  payload.writeUInt16BE(320, 4)
  payload.writeUInt8(text.length, 6)
  text.copy(payload, 7)
  payload.writeUInt16BE(0, 7 + text.length)
  payload.writeUInt16BE(0, 9 + text.length)
  const frame = Buffer.alloc(7 + payload.length + 1)
  frame.writeUInt8(1, 0)
  frame.writeUInt16BE(0, 1)
  frame.writeUInt32BE(payload.length, 3)
  payload.copy(frame, 7)
  frame.writeUInt8(0xce, 7 + payload.length)
  return frame
}

export const startTcpProxy = async (targetHost: string, targetPort: number): Promise<TcpProxy> => {
  let blocked = false
  let closesAfterOpen = 0
  const sockets = new Set<net.Socket>()
  const clients = new Set<net.Socket>()
  const server = net.createServer((client) => {
    if (blocked) {
      client.destroy()
      return
    }
    const upstream = net.connect(targetPort, targetHost)
    sockets.add(client)
    sockets.add(upstream)
    clients.add(client)
    const drop = () => {
      client.destroy()
      upstream.destroy()
      sockets.delete(client)
      sockets.delete(upstream)
      clients.delete(client)
    }
    client.on("error", drop).on("close", drop)
    upstream.on("error", drop).on("close", drop)
    client.pipe(upstream)
    if (closesAfterOpen === 0) {
      upstream.pipe(client)
      return
    }
    closesAfterOpen--
    // Until the OpenOk, the broker's bytes as they come; then that frame and the Close in one write,
    // and nothing more from the broker.
    let opened = false
    upstream.on("data", (data: Buffer) => {
      if (opened) return
      const end = openOkEnd(data)
      if (end < 0) {
        client.write(data)
        return
      }
      opened = true
      client.write(Buffer.concat([data.subarray(0, end), connectionCloseFrame()]))
      upstream.destroy()
      setTimeout(() => client.end(), 100)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as net.AddressInfo).port
  return {
    port,
    urlFor: (url) => {
      const u = new URL(url)
      u.hostname = "127.0.0.1"
      u.port = String(port)
      return u.toString()
    },
    connections: () => clients.size,
    block: () => {
      blocked = true
      for (const s of sockets) s.destroy()
      sockets.clear()
      clients.clear()
    },
    unblock: () => {
      blocked = false
    },
    closeRightAfterOpen: (times) => {
      closesAfterOpen = times
    },
    close: async () => {
      blocked = true
      for (const s of sockets) s.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}
