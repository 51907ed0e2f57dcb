// Core's cleanup of a claim whose answer was lost, run by the session (no server needed): a store
// whose claim applies and then throws (the answer lost, as with a frozen PostgreSQL that resumes)
// gets a 503 at once, the handler never runs, and the detached cleanup releases the claim,
// retrying while the release fails. By default the cleanup keeps retrying for 30 s even under a
// short lease (a frozen store may apply the claim long after the lease); a cleanup that keeps
// failing gives up within its budget and never throws.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo } from './helpers.mjs';

const require = createRequire(import.meta.url);
const native = require('../native/index.js');

const SCOPE = Buffer.alloc(32, 7);
const FP = `v1:${'ab'.repeat(32)}`;

class LostClaimStore extends idempo.MemoryStore {
  constructor(failReleases) {
    super();
    this.failReleases = failReleases;
    this.releases = [];
  }

  async claim(...args) {
    await super.claim(...args);
    throw new idempo.StoreUnavailableError('the answer was lost');
  }

  async release(scope, token) {
    if (this.failReleases > 0) {
      this.failReleases--;
      this.releases.push(false);
      throw new idempo.StoreUnavailableError('still down');
    }
    const ok = await super.release(scope, token);
    this.releases.push(ok);
    return ok;
  }
}

function session(store, events, leaseMs, cleanupBudgetMs) {
  const options = cleanupBudgetMs === undefined ? { leaseMs } : { leaseMs, cleanupBudgetMs };
  return new idempo.Session({
    store,
    config: new native.FlowConfig(options),
    scope: SCOPE,
    fingerprint: FP,
    storeTimeoutMs: 1000,
    events,
    route: '/pay',
  });
}

// The cleanup's timers are unref'd (it never keeps a process alive): hold the loop open while
// waiting for its end.
function ended(events) {
  const keep = setInterval(() => undefined, 1000);
  return new Promise((resolve) => events.once('cleanup', resolve)).finally(() => clearInterval(keep));
}

test('a lost claim is released in the background after the 503', async () => {
  const store = new LostClaimStore(2);
  const events = new idempo.IdempotencyEvents();
  const done = ended(events);
  const admission = await session(store, events, 5000).admit();
  assert.equal(admission.kind, 'respond');
  assert.equal(admission.response.status, 503);
  assert.equal(admission.outcome, 'store_unavailable');
  assert.equal((await store.get(SCOPE)).record?.state, 1, 'the lost claim was applied');
  assert.deepEqual(store.releases.filter(Boolean), [], 'the 503 does not wait for the cleanup');
  const e = await done;
  assert.deepEqual(e, { route: '/pay', op: 'release', applied: true, attempts: 3 });
  assert.deepEqual(store.releases, [false, false, true]);
  assert.equal((await store.get(SCOPE)).record, null);
});

test('a cleanup that keeps failing gives up quietly within its budget', async () => {
  const store = new LostClaimStore(Infinity);
  const events = new idempo.IdempotencyEvents();
  const done = ended(events);
  // The shortest lease (1 s) and a short budget (1.5 s): delays 100, 200, 400, then 500 ms (half
  // the lease), so attempts start at 0, 0.1, 0.3, 0.7 and 1.2 s; the next would pass the budget.
  const s = session(store, events, 1000, 1500);
  const admission = await s.admit();
  assert.equal(admission.response.status, 503);
  const e = await done;
  assert.equal(e.applied, false);
  // Each attempt starts at least the sum of the delays before it after the first: at most five
  // fit in the budget whatever the machine's speed (fewer if it is slow).
  assert.ok(e.attempts >= 1 && e.attempts <= 5, `attempts: ${e.attempts}`);
  assert.equal(store.releases.length, e.attempts);
  assert.equal((await store.get(SCOPE)).record?.state, 1, 'left to its lease, as before the cleanup');
});

test('the cleanup budget is an option and is at least the lease', () => {
  assert.equal(new native.FlowConfig({ leaseMs: 1000 }).cleanupBudgetMs, 30000);
  assert.equal(new native.FlowConfig({ leaseMs: 1000, cleanupBudgetMs: 1500 }).cleanupBudgetMs, 1500);
  assert.throws(() => new native.FlowConfig({ cleanupBudgetMs: 0 }), /cleanupBudgetMs must be positive/);
  const flow = new native.ServerFlow(new native.FlowConfig({ leaseMs: 1000 }), SCOPE, FP, Buffer.alloc(16, 1));
  assert.equal(flow.start().op, 'claim');
  flow.storeFailed();
  assert.equal(flow.finished, true);
  assert.equal(flow.cleanup.budgetMs, 30000);
  assert.equal(flow.cleanup.maxDelayMs, 500);
});

/** Applies the claim and loses its answer; releases throw until `recover()`. */
class OutageStore extends idempo.MemoryStore {
  constructor() {
    super();
    this.down = true;
    this.failedAt = [];
  }

  async claim(...args) {
    await super.claim(...args);
    throw new idempo.StoreUnavailableError('the answer was lost');
  }

  recover() {
    this.down = false;
  }

  async release(scope, token) {
    if (this.down) {
      this.failedAt.push(performance.now());
      throw new idempo.StoreUnavailableError('still down');
    }
    return super.release(scope, token);
  }
}

test('a default cleanup keeps retrying past a short lease', async () => {
  // The store stays down for more than twice the 1 s lease: the default budget (30 s) keeps the
  // cleanup going, and the release applies once the store is back.
  const store = new OutageStore();
  const events = new idempo.IdempotencyEvents();
  const done = ended(events);
  const admission = await session(store, events, 1000).admit();
  assert.equal(admission.response.status, 503);
  assert.equal(admission.outcome, 'store_unavailable');
  // Wait (generously) until an attempt failed at least 2 s after the first: with the lease as the
  // budget the last attempt would have started before 1 s.
  const spread = () => (store.failedAt.length ? store.failedAt.at(-1) - store.failedAt[0] : 0);
  const deadline = performance.now() + 20000;
  while (spread() < 2000 && performance.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.ok(spread() >= 2000, `the cleanup stopped: ${store.failedAt.length} attempts`);
  assert.equal((await store.get(SCOPE)).record?.state, 1, 'still held while the store is down');
  store.recover();
  const e = await done;
  assert.equal(e.applied, true);
  assert.equal(e.attempts, store.failedAt.length + 1);
  assert.equal((await store.get(SCOPE)).record, null);
});
