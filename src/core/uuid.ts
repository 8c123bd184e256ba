/**
 * UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then randomness. Time-ordered
 * ids keep the outbox's primary-key index append-mostly. Within one
 * millisecond a counter in the random bits keeps ids from one process ordered.
 */
let lastMs = 0
let counter = 0

export const uuidv7 = (): string => {
  const bytes = new Uint8Array(16)
  globalThis.crypto.getRandomValues(bytes)
  let ms = Date.now()
  if (ms <= lastMs) {
    counter = (counter + 1) & 0xfff
    if (counter === 0) lastMs += 1
    ms = lastMs
  } else {
    lastMs = ms
    counter = bytes[6]! & 0x07 // start low so the 12-bit counter rarely wraps
  }
  bytes[0] = (ms / 2 ** 40) & 0xff
  bytes[1] = (ms / 2 ** 32) & 0xff
  bytes[2] = (ms >>> 24) & 0xff
  bytes[3] = (ms >>> 16) & 0xff
  bytes[4] = (ms >>> 8) & 0xff
  bytes[5] = ms & 0xff
  bytes[6] = 0x70 | ((counter >>> 8) & 0x0f)
  bytes[7] = counter & 0xff
  bytes[8] = 0x80 | (bytes[8]! & 0x3f)
  let hex = ""
  for (const b of bytes) hex += b.toString(16).padStart(2, "0")
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i
export const isUuid = (text: string): boolean => UUID.test(text)
