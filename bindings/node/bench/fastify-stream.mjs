// Fastify stream replies through idempo's plugin: peak RSS of the server process while it streams
// a 100 MiB reply (core's tee: sent as it streams, at most maxStoredBodyBytes recorded), and the
// time to first byte of a slow stream (a chunk every 200 ms). Plain Fastify (no plugin) is the
// baseline. Prints figures; asserts nothing. Run once: `node bench/fastify-stream.mjs`.
import { spawn } from 'node:child_process';
import http from 'node:http';
import { createRequire } from 'node:module';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';

const require = createRequire(import.meta.url);
const MiB = 1024 * 1024;
const TOTAL = 100 * MiB;
const CHUNK = 64 * 1024;

async function server(mode) {
  const Fastify = require('fastify');
  const idempo = require('../dist/index.js');
  const app = Fastify();
  if (mode === 'plugin') await app.register(idempo.idempotencyPlugin, { store: new idempo.MemoryStore(), public: true });
  const chunk = Buffer.alloc(CHUNK, 120);
  app.post('/big', async (_req, reply) => {
    let sent = 0;
    const stream = new Readable({
      read() {
        if (sent >= TOTAL) return void this.push(null);
        sent += CHUNK;
        this.push(chunk);
      },
    });
    return reply.type('application/octet-stream').send(stream);
  });
  app.post('/slow', async (_req, reply) => {
    let i = 0;
    const stream = new Readable({
      read() {
        if (i >= 5) return void this.push(null);
        const delay = i === 0 ? 0 : 200;
        i++;
        setTimeout(() => this.push(Buffer.from(`part ${i}\n`)), delay);
      },
    });
    return reply.type('text/plain').send(stream);
  });
  app.get('/rss', async () => ({ maxRssKiB: process.resourceUsage().maxRSS, rss: process.memoryUsage().rss }));
  await app.listen({ port: 0, host: '127.0.0.1' });
  process.stdout.write(`${app.server.address().port}\n`);
}

function request(port, method, path, key) {
  return new Promise((resolve, reject) => {
    const started = process.hrtime.bigint();
    const headers = key ? { 'idempotency-key': key } : {};
    const req = http.request({ host: '127.0.0.1', port, method, path, headers }, (res) => {
      let first = null;
      let bytes = 0;
      let text = '';
      res.on('data', (c) => {
        first ??= Number(process.hrtime.bigint() - started) / 1e6;
        bytes += c.length;
        if (path !== '/big') text += c;
      });
      res.on('end', () => resolve({ status: res.statusCode, firstMs: first, totalMs: Number(process.hrtime.bigint() - started) / 1e6, bytes, text }));
    });
    req.on('error', reject);
    req.end();
  });
}

async function measure(mode) {
  const child = spawn(process.execPath, [fileURLToPath(import.meta.url), 'server', mode], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise((resolve) => child.stdout.once('data', (d) => resolve(Number(String(d).trim()))));
  try {
    const before = await request(port, 'GET', '/rss').then((r) => JSON.parse(r.text));
    const big = await request(port, 'POST', '/big', 'bench-big-key-1');
    const after = await request(port, 'GET', '/rss').then((r) => JSON.parse(r.text));
    const slow = await request(port, 'POST', '/slow', 'bench-slow-key-1');
    const replay = mode === 'plugin' ? await request(port, 'POST', '/big', 'bench-big-key-1') : null;
    return { mode, before, after, big, slow, replay };
  } finally {
    child.kill();
  }
}

if (process.argv[2] === 'server') {
  await server(process.argv[3]);
} else {
  console.log(`Fastify ${require('fastify/package.json').version}, Node ${process.version}: a ${TOTAL / MiB} MiB streamed reply (${CHUNK / 1024} KiB chunks), then a slow stream (5 chunks, 200 ms apart)`);
  for (const mode of ['plain', 'plugin']) {
    const r = await measure(mode);
    const mib = (kib) => (kib / 1024).toFixed(1);
    console.log(
      `${mode.padEnd(6)} status ${r.big.status}, ${(r.big.bytes / MiB).toFixed(0)} MiB in ${r.big.totalMs.toFixed(0)} ms; ` +
        `server peak RSS ${mib(r.after.maxRssKiB)} MiB (before the reply ${mib(r.before.maxRssKiB)} MiB, +${mib(r.after.maxRssKiB - r.before.maxRssKiB)} MiB); ` +
        `slow stream: first byte ${r.slow.firstMs.toFixed(1)} ms, whole ${r.slow.totalMs.toFixed(0)} ms` +
        (r.replay ? `; retry of the 100 MiB key: ${r.replay.status} (${r.replay.bytes} bytes, response-not-retained)` : ''),
    );
  }
}
