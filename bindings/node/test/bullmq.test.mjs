// The BullMQ example (examples/bullmq-payments.mjs) against a real Redis, its workers run as
// separate processes: payments enqueued several times each (a producer's retried adds) and
// processed by three workers of four slots charge once, every job of a payment completes with
// the same result, and the same paymentId with other data fails with PayloadMismatchError. A
// worker killed mid-charge: the stalled job goes to another worker, and idempo's takeover policy
// decides (outcome_unknown: the job fails, no second charge; re_run: the same downstream key, one
// charge).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { pkgRoot, missing, sharedRedis, closeShared, uniqueName, REDIS_URL } from './helpers.mjs';

after(closeShared);

const example = path.join(pkgRoot, 'examples', 'bullmq-payments.mjs');
const skip = missing('redis') ?? false;

function startWorker(queue, extra = []) {
  const child = spawn(process.execPath, [example, 'worker', REDIS_URL, '--queue', queue, '--lock-ms', '1000', ...extra], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let err = '';
  child.stderr.on('data', (d) => { err += d; });
  const exited = new Promise((resolve) => child.on('close', (code, signal) => resolve({ code, signal, err })));
  const ready = new Promise((resolve, reject) => {
    child.stdout.on('data', (d) => { if (String(d).includes('READY')) resolve(); });
    exited.then(() => reject(new Error(`worker exited before it was ready: ${err}`)));
  });
  return { child, ready, exited, stop: async () => { if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM'); await exited; } };
}

async function settled(queue, jobs, deadlineMs = 25_000) {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const states = await Promise.all(jobs.map((j) => j.getState()));
    if (states.every((s) => s === 'completed' || s === 'failed')) return;
    if (Date.now() > end) throw new Error(`jobs not settled: ${states.join(',')}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function cleanup(queue, q, conn) {
  await q.obliterate({ force: true });
  await q.close();
  await conn.quit(); // a connection passed to BullMQ is the caller's to close
  const keys = await sharedRedis().keys(`${queue}:*`);
  if (keys.length) await sharedRedis().del(...keys);
}

async function provider(queue) {
  const calls = (await sharedRedis().lrange(`${queue}:provider:calls`, 0, -1)).map((c) => JSON.parse(c));
  const charges = await sharedRedis().hgetall(`${queue}:provider:charges`);
  return { calls, charges: Object.values(charges).map((c) => JSON.parse(c)) };
}

test('bullmq: duplicated jobs on three workers charge each payment once', { skip }, async () => {
  const { Queue, Job } = await import('bullmq');
  const { connection } = await import('../examples/bullmq-payments.mjs');
  const queue = uniqueName('pay');
  const conn = connection(REDIS_URL);
  const q = new Queue(queue, { connection: conn });
  const workers = [0, 1, 2].map(() => startWorker(queue));
  try {
    await Promise.all(workers.map((w) => w.ready));
    const added = [];
    for (let round = 0; round < 4; round++) {
      for (let n = 0; n < 10; n++) added.push(q.add('charge', { paymentId: `p-${n}`, cents: 100 + n }));
    }
    const jobs = await Promise.all(added);
    const mismatch = await q.add('charge', { paymentId: 'p-3', cents: 999 });
    await settled(queue, [...jobs, mismatch]);
    const done = await Promise.all(jobs.map((j) => Job.fromId(q, j.id)));
    const byPayment = new Map();
    for (const j of done) {
      assert.equal(j.failedReason, undefined, j.failedReason);
      const seen = byPayment.get(j.data.paymentId);
      if (seen) assert.deepEqual(j.returnvalue, seen); // the stored result, replayed
      else byPayment.set(j.data.paymentId, j.returnvalue);
      assert.equal(j.returnvalue.cents, j.data.cents);
    }
    assert.equal(byPayment.size, 10);
    const m = await Job.fromId(q, mismatch.id);
    assert.match(m.failedReason, /^PayloadMismatchError/);
    assert.equal(m.attemptsMade, 1);
    const { calls, charges } = await provider(queue);
    assert.deepEqual(calls.map((c) => c.paymentId).sort(), Array.from({ length: 10 }, (_, n) => `p-${n}`).sort());
    assert.equal(charges.length, 10);
  } finally {
    await Promise.all(workers.map((w) => w.stop()));
    await cleanup(queue, q, conn);
  }
});

for (const takeover of ['outcome_unknown', 're_run']) {
  test(`bullmq: a worker killed mid-charge, takeover ${takeover}`, { skip }, async () => {
    const { Queue, Job } = await import('bullmq');
    const { connection } = await import('../examples/bullmq-payments.mjs');
    const queue = uniqueName('kill');
    const conn = connection(REDIS_URL);
    const q = new Queue(queue, { connection: conn });
    const policy = ['--takeover', takeover, '--lease-ms', '2000'];
    const doomed = startWorker(queue, [...policy, '--provider-delay-ms', '60000']);
    let survivor;
    try {
      await doomed.ready;
      const job = await q.add('charge', { paymentId: 'p-kill', cents: 500 });
      const end = Date.now() + 20_000;
      while ((await provider(queue)).calls.length === 0) {
        assert.ok(Date.now() < end, 'the doomed worker never called the provider');
        await new Promise((r) => setTimeout(r, 50));
      }
      doomed.child.kill('SIGKILL');
      assert.equal((await doomed.exited).signal, 'SIGKILL');
      survivor = startWorker(queue, policy);
      await survivor.ready;
      await settled(queue, [job]);
      const after = await Job.fromId(q, job.id);
      const { calls, charges } = await provider(queue);
      assert.equal(charges.length, 1); // the customer is charged once either way
      if (takeover === 'outcome_unknown') {
        assert.equal(await after.getState(), 'failed');
        assert.match(after.failedReason, /^CallOutcomeUnknownError/);
        assert.equal(calls.length, 1); // never run twice
      } else {
        assert.equal(await after.getState(), 'completed', after.failedReason);
        assert.deepEqual(after.returnvalue, { paymentId: 'p-kill', cents: 500, chargeId: after.returnvalue.chargeId });
        assert.equal(calls.length, 2);
        assert.equal(calls[0].idempotencyKey, calls[1].idempotencyKey); // the provider deduplicates
      }
      // A later redelivery of the same payment: replayed or refused, never charged again.
      const again = await q.add('charge', { paymentId: 'p-kill', cents: 500 });
      await settled(queue, [again]);
      const last = await Job.fromId(q, again.id);
      if (takeover === 'outcome_unknown') assert.match(last.failedReason, /^CallOutcomeUnknownError/);
      else assert.deepEqual(last.returnvalue, after.returnvalue);
      assert.equal((await provider(queue)).calls.length, takeover === 'outcome_unknown' ? 1 : 2);
    } finally {
      await doomed.stop();
      if (survivor) await survivor.stop();
      await cleanup(queue, q, conn);
    }
  });
}
