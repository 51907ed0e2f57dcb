// The README's client example (see server.mts).
declare const order: { amount: number; currency: string };
// ---- README ----
import { idempotentFetch } from 'idempo';

const res = await idempotentFetch('https://api.example/payments', {
  method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(order),
  signal: AbortSignal.timeout(30_000), attemptTimeoutMs: 5_000,
});
console.log(res.status, await res.json());
