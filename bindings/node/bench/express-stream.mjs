// Streaming through the Express middleware (issue 14): peak RSS of the server process while it
// streams a 100 MiB response to a client, and the time to first byte of a slow stream, with and
// without idempotency(). Prints figures; asserts nothing (run once: `make bench-node-express`).
import { spawn } from 'node:child_process';
import http from 'node:http';
import { fileURLToPath } from 'node:url';

const MiB = 1024 * 1024;
const TOTAL = 100 * MiB;

if (process.argv[2] === 'server') {
  const { createRequire } = await import('node:module');
  const require = createRequire(import.meta.url);
  const express = require('express');
  const idempo = require('../dist/index.js');
  const { Readable } = await import('node:stream');
  const app = express();
  const mw = idempo.idempotency({ store: new idempo.MemoryStore() });
  const big = (_req, res) => {
    const chunk = Buffer.alloc(64 * 1024, 0x61);
    let sent = 0;
    res.status(200).type('application/octet-stream');
    Readable.from((function* () {
      while (sent < TOTAL) {
        sent += chunk.length;
        yield chunk;
      }
    })()).pipe(res);
  };
  const slow = (_req, res) => {
    res.status(200).type('text/plain');
    let n = 0;
    res.write('first\n');
    const t = setInterval(() => {
      n++;
      if (n === 5) {
        clearInterval(t);
        res.end('last\n');
      } else res.write(`chunk ${n}\n`);
    }, 200);
  };
  app.post('/big', mw, big);
  app.post('/big-plain', big);
  app.post('/slow', mw, slow);
  app.post('/slow-plain', slow);
  app.get('/rss', (_req, res) => res.json({ maxRssKiB: process.resourceUsage().maxRSS, rss: process.memoryUsage().rss }));
  const s = app.listen(0, '127.0.0.1', () => process.send({ port: s.address().port }));
} else {
  const child = spawn(process.execPath, [fileURLToPath(import.meta.url), 'server'], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const { port } = await new Promise((r) => child.once('message', r));
  const request = (path, key) =>
    new Promise((resolve, reject) => {
      const t0 = process.hrtime.bigint();
      let first = null;
      let bytes = 0;
      const headers = { 'content-type': 'application/json', 'content-length': '2' };
      if (key) headers['idempotency-key'] = key;
      const req = http.request({ host: '127.0.0.1', port, path, method: 'POST', headers }, (res) => {
        const head = Number(process.hrtime.bigint() - t0) / 1e6;
        res.on('data', (c) => {
          if (first === null) first = Number(process.hrtime.bigint() - t0) / 1e6;
          bytes += c.length;
        });
        res.on('end', () => resolve({ status: res.statusCode, head, first, total: Number(process.hrtime.bigint() - t0) / 1e6, bytes, replayed: res.headers['idempotent-replayed'] }));
      });
      req.on('error', reject);
      req.end('{}');
    });
  const rss = async () => {
    const r = await fetch(`http://127.0.0.1:${port}/rss`);
    return r.json();
  };
  const key = () => `bench-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  const idle = await rss();
  const plain = await request('/big-plain');
  const afterPlain = await rss();
  const big = await request('/big', key());
  const afterBig = await rss();
  const k = key();
  const slowRun = await request('/slow', k);
  const slowReplay = await request('/slow', k);
  const slowPlain = await request('/slow-plain');
  child.kill();
  const mib = (kib) => (kib / 1024).toFixed(1);
  console.log('Express (node %s), 100 MiB streamed response, MemoryStore, default maxStoredBodyBytes (1 MiB)', process.versions.node);
  console.log('  peak RSS of the server: idle %s MiB; after the stream without idempotency %s MiB; after the stream through idempotency() %s MiB', mib(idle.maxRssKiB), mib(afterPlain.maxRssKiB), mib(afterBig.maxRssKiB));
  console.log('  growth of peak RSS over the plain stream: %s MiB (target: record limit 1 MiB + 16 MiB)', mib(afterBig.maxRssKiB - afterPlain.maxRssKiB));
  console.log('  bytes received %d / %d (status %d), plain %d', big.bytes, TOTAL, big.status, plain.bytes);
  console.log('  time: plain %s ms, through idempotency() %s ms', plain.total.toFixed(0), big.total.toFixed(0));
  console.log('Slow stream (first chunk at once, then 4 more every 200 ms):');
  console.log('  time to first byte: through idempotency() %s ms (headers %s ms), without %s ms; whole response %s ms', slowRun.first.toFixed(1), slowRun.head.toFixed(1), slowPlain.first.toFixed(1), slowRun.total.toFixed(0));
  console.log('  retry with the same key: status %d, replayed %s, %d bytes, first byte %s ms', slowReplay.status, slowReplay.replayed, slowReplay.bytes, slowReplay.first.toFixed(1));
}
