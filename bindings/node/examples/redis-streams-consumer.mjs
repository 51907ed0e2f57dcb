// A Redis Streams consumer group (ioredis) whose handler runs once per message, however often it
// is delivered: several consumers, pending messages of a crashed consumer claimed again
// (XAUTOCLAIM), and a producer that retried its XADD all end in one charge.
//
// The key is the producer's own message id (`msgId` field), not the stream entry id (a producer
// retry adds a new entry with a new entry id). A message whose call is in flight elsewhere stays
// pending (not acknowledged) and is claimed again later.
//
// Run:  node examples/redis-streams-consumer.mjs redis://localhost:6379/0 consumer-1
import Redis from 'ioredis';
import { idempotent, currentCall, CallInFlightError, RedisStore } from 'idempo';

export const STREAM = 'orders';
export const GROUP = 'billing';

/** The idempotent handler; `charges` stands for the payment provider. */
export function makeHandler(store, charges) {
  return idempotent(
    async (message) => {
      charges.push([message.order, currentCall().downstreamKey]);
      return `charged ${message.order}`;
    },
    { store, name: 'billing.charge', key: (message) => message.msgId, leaseMs: 10_000 },
  );
}

export async function ensureGroup(client) {
  try {
    await client.xgroup('CREATE', STREAM, GROUP, '0', 'MKSTREAM');
  } catch (e) {
    if (!String(e.message).includes('BUSYGROUP')) throw e;
  }
}

function fields(flat) {
  const out = {};
  for (let i = 0; i + 1 < flat.length; i += 2) out[flat[i]] = flat[i + 1];
  return out;
}

/** One batch: pending messages idle for `minIdleMs` (a crashed consumer's), then new ones.
 * Acknowledges each handled message; returns how many were acknowledged. */
export async function consumeOnce(client, consumer, handler, { blockMs = 200, minIdleMs = 5_000 } = {}) {
  const [, claimed] = await client.xautoclaim(STREAM, GROUP, consumer, minIdleMs, '0-0', 'COUNT', 10);
  const batch = [...claimed];
  const fresh = await client.xreadgroup('GROUP', GROUP, consumer, 'COUNT', 10, 'BLOCK', blockMs, 'STREAMS', STREAM, '>');
  for (const [, entries] of fresh ?? []) batch.push(...entries);
  let acked = 0;
  for (const [id, flat] of batch) {
    try {
      await handler(fields(flat));
    } catch (e) {
      if (e instanceof CallInFlightError) continue; // stays pending, claimed again later
      throw e;
    }
    await client.xack(STREAM, GROUP, id);
    acked++;
  }
  return acked;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const [url, consumer] = process.argv.slice(2);
  const client = new Redis(url);
  const store = new RedisStore({ url });
  await ensureGroup(client);
  const handler = makeHandler(store, []);
  for (;;) await consumeOnce(client, consumer, handler, { blockMs: 1_000 });
}
