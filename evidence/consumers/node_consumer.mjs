// One Redis Streams consumer process of the consumers evidence row (evidence/consumers/run.py), in
// Node: the same loop, log lines and answers as py_consumer.py, with ioredis and `idempotent`.
//
//   node evidence/consumers/node_consumer.mjs URL NAME LOG TAKEOVER LEASE_MS CLAIM_IDLE_MS
//
// A result (fresh or replayed) is acknowledged; CallOutcomeUnknownError and PayloadMismatchError
// are acknowledged as dead letters; CallInFlightError, CallStoreUnavailableError and a broker
// error leave the entry pending, claimed again later. Each log line is one fs.writeSync on a file
// opened for appending (nothing buffered in the process).
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const require = createRequire(path.join(root, 'bindings', 'node', 'package.json'));
const idempo = require('./dist/index.js');
const Redis = require('ioredis');

const STREAM = 'orders';
const GROUP = 'billing';
const [url, name, logPath, takeover, leaseMs, claimIdleMs] = process.argv.slice(2);
const fd = fs.openSync(logPath, 'a');
const log = (rec) => fs.writeSync(fd, `${JSON.stringify({ pid: process.pid, t: Date.now() / 1000, ...rec })}\n`);
const options = { maxRetriesPerRequest: 1, connectTimeout: 1000, retryStrategy: () => 100 };
const client = new Redis(url, options);
const store = new idempo.RedisStore({ client: new Redis(url, options) });
client.on('error', () => undefined); // reported per command below
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

const charge = idempo.idempotent(
  async (m) => {
    const call = idempo.currentCall();
    log({ ev: 'exec', msg: m.msg_id, cents: m.cents, dk: call.downstreamKey, gen: call.generation });
    await sleep(Number(m.work_ms));
    return { charged: m.msg_id, cents: Number(m.cents) };
  },
  {
    store,
    name: 'ev.charge',
    key: (m) => m.msg_id,
    payload: (m) => ({ msg_id: m.msg_id, cents: m.cents }),
    leaseMs: Number(leaseMs),
    takeover,
  },
);

const fields = (flat) => {
  const out = {};
  for (let i = 0; i + 1 < flat.length; i += 2) out[flat[i]] = flat[i + 1];
  return out;
};
const deadLetters = [idempo.CallOutcomeUnknownError, idempo.PayloadMismatchError];
const retryLater = [idempo.CallInFlightError, idempo.CallStoreUnavailableError];

log({ ev: 'start', name });
for (;;) {
  let batch;
  try {
    const [, claimed] = await client.xautoclaim(STREAM, GROUP, name, Number(claimIdleMs), '0-0', 'COUNT', 10);
    batch = [...claimed];
    const fresh = await client.xreadgroup('GROUP', GROUP, name, 'COUNT', 10, 'BLOCK', 200, 'STREAMS', STREAM, '>');
    for (const [, entries] of fresh ?? []) batch.push(...entries);
  } catch (e) {
    log({ ev: 'broker_error', kind: e?.constructor?.name ?? 'Error' });
    await sleep(100);
    continue;
  }
  for (const [id, flat] of batch) {
    const m = fields(flat);
    log({ ev: 'delivery', msg: m.msg_id, cents: m.cents });
    let outcome = 'done';
    let result = null;
    try {
      result = await charge(m);
    } catch (e) {
      const kind = e?.constructor?.name ?? 'Error';
      if (deadLetters.some((c) => e instanceof c)) {
        log({ ev: 'typed', kind, msg: m.msg_id });
        outcome = kind;
      } else if (retryLater.some((c) => e instanceof c) || e instanceof idempo.IdempoError) {
        log({ ev: 'typed', kind, msg: m.msg_id, text: String(e.message) });
        continue;
      } else {
        log({ ev: 'untyped', kind, msg: m.msg_id, text: String(e?.message ?? e) });
        continue;
      }
    }
    try {
      await client.xack(STREAM, GROUP, id);
    } catch (e) {
      log({ ev: 'broker_error', kind: e?.constructor?.name ?? 'Error' });
      continue;
    }
    log({ ev: 'ack', msg: m.msg_id, cents: m.cents, outcome, result });
  }
}
