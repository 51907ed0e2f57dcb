// CPU time idempo's Express middleware and Fastify plugin add per request on `MemoryStore`, fresh
// key and replay, measured in one process with no network: each app is a real `http.Server` fed
// through an in-memory socket (node's own HTTP parser, `IncomingMessage` and `ServerResponse`, so
// the middleware takes the same paths as behind a listening socket), one keep-alive connection per
// app, requests sent one after another. The figure is the process's CPU time (user + system,
// `process.cpuUsage()`, every thread: GC included) per request of each variant minus the bare
// app's, compared turn by turn (see below): the median and a trimmed mean of those differences. The
// apps are those of `bench/e2e-server.mjs` (a trivial JSON handler behind express.json(), or
// behind idempo on MemoryStore; Fastify's own JSON parsing). Figures only, nothing asserted.
//
//   node bench/inproc-overhead.mjs [requests=1500] [rounds=15] [frameworks=express,fastify] [dist=dist]
//
// Within a round the variants take turns every 100 requests, and there are many rounds: on a
// shared machine the neighbours' load moves every figure, and it falls on every variant alike.
//
// `dist` names another compiled copy of the package's TypeScript in this folder (`dist-before`,
// ...) for a before/after run in one process: it is measured as an extra variant `memory@<dir>`.
import { createRequire } from 'node:module';
import { Duplex } from 'node:stream';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', 'package.json'));
const requests = Number(process.argv[2] ?? 1500);
const rounds = Number(process.argv[3] ?? 15);
const frameworks = (process.argv[4] ?? 'express,fastify').split(',');
const dists = (process.argv[5] ?? 'dist').split(',');
const http = require('node:http');

const body = JSON.stringify({ amount: 1999, currency: 'eur', customer: 'cus_4QF8XkT1b2N9', description: 'Order #10045 for two items', metadata: { order_id: '10045', channel: 'web', campaign: 'spring' }, items: [{ sku: 'A-1', qty: 1 }, { sku: 'B-7', qty: 2 }] });
const bodyBytes = Buffer.from(body);

/** A socket the server reads requests from and writes responses to, in memory. */
class MemSocket extends Duplex {
  constructor() {
    super();
    this.buf = Buffer.alloc(0);
    this.waiting = null;
    this.remoteAddress = '127.0.0.1';
    this.remotePort = 40000;
    this.localAddress = '127.0.0.1';
    this.localPort = 80;
    this.encrypted = false;
  }
  _read() {}
  _write(chunk, _enc, cb) {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    this.check();
    cb();
  }
  _writev(chunks, cb) {
    this.buf = Buffer.concat([this.buf, ...chunks.map((c) => c.chunk)]);
    this.check();
    cb();
  }
  setTimeout() { return this; }
  setNoDelay() { return this; }
  setKeepAlive() { return this; }
  address() { return { address: '127.0.0.1', family: 'IPv4', port: 80 }; }
  /** Resolves the waiting request once a whole response (Content-Length framed) is in. */
  check() {
    if (this.waiting === null) return;
    const end = this.buf.indexOf('\r\n\r\n');
    if (end < 0) return;
    const head = this.buf.toString('latin1', 0, end);
    const m = /\r\ncontent-length: *(\d+)/i.exec(head);
    if (!m) throw new Error(`response without content-length:\n${head}`);
    const total = end + 4 + Number(m[1]);
    if (this.buf.length < total) return;
    const status = Number(head.slice(9, 12));
    this.buf = this.buf.subarray(total);
    const w = this.waiting;
    this.waiting = null;
    w(status);
  }
  request(key) {
    const req = `POST /payments HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: ${bodyBytes.length}\r\nIdempotency-Key: ${key}\r\n\r\n`;
    return new Promise((resolve) => {
      this.waiting = resolve;
      this.push(Buffer.concat([Buffer.from(req, 'latin1'), bodyBytes]));
    });
  }
}

let n = 0;
const handler = (b) => ({ ok: true, n: ++n, amount: b?.amount ?? null });

async function app(framework, variant) {
  const [storeName, distDir] = variant.split('@');
  const idempo = storeName === 'bare' ? null : require(`./${distDir ?? 'dist'}/index.js`);
  const store = idempo ? new idempo.MemoryStore({ maxEntries: 10_000_000, maxBytes: 8 * 1024 ** 3, maxEntriesPerPartition: 10_000_000, maxBytesPerPartition: 8 * 1024 ** 3 }) : null;
  let server;
  if (framework === 'express') {
    const express = require('express');
    const a = express();
    if (store) a.post('/payments', idempo.idempotency({ store, public: true }), (req, res) => res.json(handler(req.body)));
    else a.post('/payments', express.json(), (req, res) => res.json(handler(req.body)));
    server = http.createServer(a);
  } else {
    const fastify = require('fastify');
    const a = fastify();
    if (store) await a.register(idempo.idempotencyPlugin, { store, public: true });
    a.post('/payments', async (req) => handler(req.body));
    await a.ready();
    server = a.server;
  }
  const socket = new MemSocket();
  server.emit('connection', socket);
  return socket;
}

// INPROC_PROFILE=<framework>/<variant>:<mode> (e.g. `fastify/memory:fresh`): only that variant and
// mode, no bare app and no figures (for `node --cpu-prof`).
const only = process.env.INPROC_PROFILE;
const variants = [];
for (const f of frameworks) {
  variants.push([f, 'bare']);
  for (const d of dists) variants.push([f, d === 'dist' ? 'memory' : `memory@${d}`]);
}
const sockets = new Map();
for (const [f, v] of variants) sockets.set(`${f}/${v}`, await app(f, v));

/** `count` requests (fresh: keys `<tag>-<from>`, `<tag>-<from + 1>`, ...; replay: the key `<tag>`):
 * the process's CPU time per request, µs. */
async function run(socket, mode, tag, count, from = 0) {
  const before = process.cpuUsage();
  for (let i = from; i < from + count; i++) {
    const status = await socket.request(mode === 'fresh' ? `idem-key-${tag}-${i}` : `idem-key-${tag}`);
    if (status !== 200) throw new Error(`${tag}: status ${status}`);
  }
  const used = process.cpuUsage(before);
  return (used.user + used.system) / count;
}

if (only) {
  const [name, mode] = only.split(':');
  const s = sockets.get(name);
  await run(s, mode, 'warm', Math.min(requests, 3000));
  console.log(`${only}: ${(await run(s, mode, 'profiled', requests)).toFixed(1)} cpu µs/req`);
  process.exit(0);
}

// Warm-up: every variant and mode, until the JIT settles.
for (const [name, s] of sockets) for (const mode of ['fresh', 'replay']) await run(s, mode, `warm-${name}-${mode}`, Math.min(requests, 3000));

const CHUNK = 100;
/** Per variant and mode: the CPU time per request of each chunk, and its difference from the
 * bare app's chunk of the same turn. */
const samples = new Map();
for (let r = 0; r < rounds; r++) {
  for (const mode of ['fresh', 'replay']) {
    // Rotated per round, so no variant always runs right after another.
    const order = [...sockets];
    for (let i = 0; i < r % order.length; i++) order.push(order.shift());
    // The variants take turns every `CHUNK` requests: a neighbour's burst of load falls on all
    // of them alike, and each chunk is compared with the bare app's chunk of the same turn.
    for (let done = 0; done < requests; done += CHUNK) {
      const count = Math.min(CHUNK, requests - done);
      const cpu = new Map();
      for (const [name, s] of order) cpu.set(name, await run(s, mode, `r${r}-${name}-${mode}`, count, done));
      for (const [name] of order) {
        const k = `${name} ${mode}`;
        if (!samples.has(k)) samples.set(k, { cpu: [], added: [] });
        samples.get(k).cpu.push(cpu.get(name));
        samples.get(k).added.push(cpu.get(name) - cpu.get(`${name.split('/')[0]}/bare`));
      }
    }
  }
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
/** The mean of the middle 60% (the bursts of a shared machine left out at both ends). */
const trimmed = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const cut = Math.floor(s.length * 0.2);
  const mid = s.slice(cut, s.length - cut);
  return mid.reduce((a, b) => a + b, 0) / mid.length;
};
const q = (xs, f) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) * f)];
console.log(`in-process, node ${process.version}, ${rounds} rounds x ${requests} requests per variant and mode, in turns of ${CHUNK}; CPU µs per request`);
console.log('variant                          mode     cpu µs/req  added µs/req: median  trimmed mean  (quartiles)');
for (const [f, v] of variants) {
  for (const mode of ['fresh', 'replay']) {
    const s = samples.get(`${f}/${v} ${mode}`);
    console.log(`${`${f}/${v}`.padEnd(32)} ${mode.padEnd(7)} ${median(s.cpu).toFixed(1).padStart(11)} ${median(s.added).toFixed(1).padStart(20)} ${trimmed(s.added).toFixed(1).padStart(13)}  (${q(s.added, 0.25).toFixed(1)}..${q(s.added, 0.75).toFixed(1)})`);
  }
}
process.exit(0);
