// A BullMQ payments worker whose charge runs once per payment, however often the job is
// delivered: a producer that retried its `queue.add` (a new job each time), several workers with
// several slots each, and a worker killed mid-job (BullMQ's stalled-job check hands the job to
// another worker) all end in one charge.
//
// The key is the payment's own id (`paymentId` in the job's data), not BullMQ's job id: a
// producer retry adds a new job with a new id, and BullMQ's own `jobId` deduplication holds only
// while the first job is kept (`removeOnComplete` drops it). The charge is sent to the provider
// under `currentCall().downstreamKey`, which the provider deduplicates on (as Stripe does with an
// Idempotency-Key): the same for every run of one payment.
//
// What each answer does to the job:
// - the charge ran, or ran earlier (its stored result is replayed): the job completes with it;
// - CallInFlightError (another worker runs this payment now) or CallStoreUnavailableError: the
//   job is delayed by `retryAfterMs` (DelayedError: no attempt is used up) and tried again;
// - PayloadMismatchError (the same paymentId with other data: a producer bug) or
//   CallOutcomeUnknownError: the job fails at once (UnrecoverableError), for a person to look at.
//
// A worker killed mid-charge: BullMQ's lock on the job ends (`lockDuration`), another worker's
// stalled check moves it back to the queue and a worker takes it. While the dead worker's idempo
// lease lasts, that is CallInFlightError (delayed, tried again). After the lease, the takeover
// policy decides: `outcome_unknown` (the default) fails the job with CallOutcomeUnknownError and
// never charges again, because the first charge may have gone through; `re_run` (`--takeover
// re_run`, for a provider that deduplicates on the downstream key) charges again under the same
// downstream key, which the provider recognises, so the customer is charged once.
//
// Run a worker:      node examples/bullmq-payments.mjs worker redis://localhost:6379/0
// Enqueue payments:  node examples/bullmq-payments.mjs enqueue redis://localhost:6379/0 pay-1 1250
// Options: --queue NAME (default payments), --concurrency N (4), --takeover outcome_unknown|re_run,
// --lease-ms N (idempo's lease, 10000), --lock-ms N (BullMQ's lockDuration and stalledInterval,
// 30000), --provider-delay-ms N (how long the stand-in provider takes to answer, 0).
import { parseArgs } from 'node:util';
import Redis from 'ioredis';
import { DelayedError, Queue, UnrecoverableError, Worker } from 'bullmq';
import {
  CallInFlightError,
  CallOutcomeUnknownError,
  CallStoreUnavailableError,
  PayloadMismatchError,
  RedisStore,
  currentCall,
  idempotent,
} from 'idempo';

/**
 * A stand-in payment provider kept in Redis: every request is logged (`<prefix>calls`), and a
 * charge is made once per idempotency key (`<prefix>charges`), as a real provider does. The
 * answer comes `delayMs` after the charge (a slow provider: the worker may die before it).
 */
export function redisProvider(client, prefix, delayMs = 0) {
  return {
    async charge(payment, idempotencyKey) {
      await client.rpush(`${prefix}calls`, JSON.stringify({ paymentId: payment.paymentId, idempotencyKey }));
      await client.hsetnx(`${prefix}charges`, idempotencyKey, JSON.stringify(payment));
      if (delayMs > 0) await new Promise((resolve) => setTimeout(resolve, delayMs));
      return { paymentId: payment.paymentId, cents: payment.cents, chargeId: `ch_${idempotencyKey.slice(0, 16)}` };
    },
  };
}

/** The BullMQ processor: the idempotent charge, and what each of its answers does to the job. */
export function makeProcessor(store, provider, { takeover = 'outcome_unknown', leaseMs = 10_000 } = {}) {
  const charge = idempotent(
    (payment) => provider.charge(payment, currentCall().downstreamKey),
    { store, name: 'payments.charge', key: (payment) => payment.paymentId, leaseMs, takeover },
  );
  return async (job, token) => {
    try {
      return await charge(job.data);
    } catch (e) {
      if (e instanceof CallInFlightError || e instanceof CallStoreUnavailableError) {
        await job.moveToDelayed(Date.now() + e.retryAfterMs, token);
        throw new DelayedError();
      }
      if (e instanceof PayloadMismatchError || e instanceof CallOutcomeUnknownError) {
        throw new UnrecoverableError(`${e.name}: ${e.message}`);
      }
      throw e;
    }
  };
}

/** The Redis connection BullMQ's workers need (blocking commands: no per-request retry limit). */
export function connection(url) {
  return new Redis(url, { maxRetriesPerRequest: null });
}

/** A worker on `queue`, its idempo records under `<queue>:idempo:`, the provider's under `<queue>:provider:`. */
export function startWorker(url, { queue = 'payments', concurrency = 4, takeover, leaseMs, lockMs = 30_000, providerDelayMs = 0 } = {}) {
  const client = new Redis(url);
  const store = new RedisStore({ client, prefix: `${queue}:idempo:` });
  const provider = redisProvider(client, `${queue}:provider:`, providerDelayMs);
  const bullConnection = connection(url);
  const worker = new Worker(queue, makeProcessor(store, provider, { takeover, leaseMs }), {
    connection: bullConnection,
    concurrency,
    lockDuration: lockMs,
    stalledInterval: lockMs,
  });
  const close = async () => {
    await worker.close(); // waits for the jobs in hand
    await Promise.all([bullConnection.quit(), client.quit()]);
  };
  return { worker, close };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: {
      queue: { type: 'string', default: 'payments' },
      concurrency: { type: 'string', default: '4' },
      takeover: { type: 'string', default: 'outcome_unknown' },
      'lease-ms': { type: 'string', default: '10000' },
      'lock-ms': { type: 'string', default: '30000' },
      'provider-delay-ms': { type: 'string', default: '0' },
    },
  });
  const [mode, url, paymentId, cents] = positionals;
  if (mode === 'enqueue') {
    const bullConnection = connection(url);
    const queue = new Queue(values.queue, { connection: bullConnection });
    const job = await queue.add('charge', { paymentId, cents: Number(cents) }, { attempts: 3 });
    process.stdout.write(`enqueued job ${job.id}\n`);
    await queue.close();
    await bullConnection.quit();
  } else {
    const { worker, close } = startWorker(url, {
      queue: values.queue,
      concurrency: Number(values.concurrency),
      takeover: values.takeover,
      leaseMs: Number(values['lease-ms']),
      lockMs: Number(values['lock-ms']),
      providerDelayMs: Number(values['provider-delay-ms']),
    });
    process.on('SIGTERM', () => close().then(() => process.exit(0))); // finish the jobs in hand
    await worker.waitUntilReady();
    process.stdout.write(`READY ${process.pid}\n`);
  }
}
