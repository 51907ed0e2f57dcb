// The README's idempotent-function example (test/types.test.mjs checks it is the README's text and
// compiles): `charge` keeps the wrapped function's parameters and result type.
declare const provider: {
  charge(order: string, options: { idempotencyKey: string }): Promise<{ id: string }>;
};
// ---- README ----
import { idempotent, currentCall, RedisStore } from 'idempo';

const store = new RedisStore({ url: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' });

const charge = idempotent(
  async (msg: { msgId: string; order: string }) => {
    const call = currentCall()!; // call.downstreamKey goes to the payment provider
    return provider.charge(msg.order, { idempotencyKey: call.downstreamKey });
  },
  { store, name: 'billing.charge', key: (msg) => msg.msgId, leaseMs: 30_000 },
);
const receipt = await charge({ msgId: 'm-1', order: 'o-42' }); // provider.charge's result type
console.log(receipt.id); // a redelivery of m-1 gets the same receipt without charging again
