// Core's cleanup of a claim whose answer was lost, run by the session (no server needed): a store
// whose claim applies and then throws (the answer lost, as with a frozen PostgreSQL that resumes)
// gets a 503 at once, the handler never runs, and the detached cleanup releases the claim,
// retrying while the release fails. A cleanup that keeps failing gives up within the lease and
// never throws.
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

function session(store, events, leaseMs) {
  return new idempo.Session({
    store,
    config: new native.FlowConfig({ leaseMs }),
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

test('a cleanup that keeps failing gives up quietly within the lease', async () => {
  const store = new LostClaimStore(Infinity);
  const events = new idempo.IdempotencyEvents();
  const done = ended(events);
  const admission = await session(store, events, 1000).admit();
  assert.equal(admission.response.status, 503);
  const e = await done;
  // Attempts at 0, 0.1, 0.3, 0.7 s (three if the machine is slow); the next would pass the lease.
  assert.equal(e.applied, false);
  assert.ok(e.attempts === 3 || e.attempts === 4, `attempts: ${e.attempts}`);
  assert.equal(store.releases.length, e.attempts);
  assert.equal((await store.get(SCOPE)).record?.state, 1, 'left to its lease, as before the cleanup');
});
