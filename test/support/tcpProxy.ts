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
  readonly close: () => Promise<void>
}

export const startTcpProxy = async (targetHost: string, targetPort: number): Promise<TcpProxy> => {
  let blocked = false
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
    upstream.pipe(client)
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
    close: async () => {
      blocked = true
      for (const s of sockets) s.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}
