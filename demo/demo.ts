// The embedded demo (PGlite + the in-memory broker) lands with issue #5; until then this says so.
console.log(
  "txbox demo: the embedded end-to-end demo (orders → outbox → relay → inbox) is coming with the next release.",
)
console.log("Run the test suite with `npm test` to see txbox against real PostgreSQL and RabbitMQ.")
