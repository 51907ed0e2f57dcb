// The ioredis Redis Streams example (examples/redis-streams-consumer.mjs) against a real Redis:
// each message added three times and read by three consumers is charged once, and a redelivery
// after its acknowledgement replays without a charge.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { idempo, missing, sharedRedis, closeShared, uniqueName } from './helpers.mjs';

after(closeShared);

test('redis streams consumer group: one charge per message id', { skip: missing('redis') ?? false }, async () => {
  const ex = await import('../examples/redis-streams-consumer.mjs');
  const client = sharedRedis();
  await client.del(ex.STREAM);
  await ex.ensureGroup(client);
  for (let n = 0; n < 15; n++) {
    for (let i = 0; i < 3; i++) await client.xadd(ex.STREAM, '*', 'msgId', `m-${n}`, 'order', `o-${n}`);
  }
  const prefix = `${uniqueName('idempo_streams')}:`;
  const charges = [];
  const consumers = [0, 1, 2].map((i) => {
    const c = client.duplicate();
    const store = new idempo.RedisStore({ client: c, prefix });
    return { c, handler: ex.makeHandler(store, charges), name: `c-${i}` };
  });
  await Promise.all(consumers.map(async ({ c, handler, name }) => {
    let idle = 0;
    while (idle < 3) idle = (await ex.consumeOnce(c, name, handler, { minIdleMs: 100 })) === 0 ? idle + 1 : 0;
  }));
  assert.deepEqual(charges.map(([o]) => o).sort(), Array.from({ length: 15 }, (_, n) => `o-${n}`).sort());
  const pending = await client.xpending(ex.STREAM, ex.GROUP);
  assert.equal(pending[0], 0);
  await client.xadd(ex.STREAM, '*', 'msgId', 'm-3', 'order', 'o-3');
  assert.equal(await ex.consumeOnce(consumers[0].c, 'c-0', consumers[0].handler), 1);
  assert.equal(charges.length, 15);
  for (const { c } of consumers) c.disconnect();
  await client.del(ex.STREAM);
});
