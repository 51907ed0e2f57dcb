// kill -9 of a consumer process mid-function (test/fixtures/crash-consumer.mjs) on real stores:
// a redelivery while the dead consumer's lease lasts rejects with CallInFlightError and does not
// run the function; after the lease, the takeover policy decides: `outcome_unknown` (the default)
// rejects with CallOutcomeUnknownError and never runs it again, `re_run` runs it once more under
// the same downstream key (so a downstream-keyed effect deduplicates) and then replays.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { here, missing, uniqueName, sharedPgPool, sharedRedis, closeShared, idempo, PG_DSN, REDIS_URL } from './helpers.mjs';

after(closeShared);

const consumer = path.join(here, 'fixtures', 'crash-consumer.mjs');

/** Where each store lives for the child processes, and how to clean it. */
const targets = {
  sqlite: {
    skip: () => null,
    async make(dir) {
      return { where: path.join(dir, 'calls.sqlite3'), namespace: '-', cleanup: async () => {} };
    },
  },
  redis: {
    skip: () => missing('redis'),
    async make() {
      const prefix = `${uniqueName('idempo_kill')}:`;
      return {
        where: REDIS_URL,
        namespace: prefix,
        cleanup: async () => {
          const keys = await sharedRedis().keys(`${prefix}*`);
          if (keys.length) await sharedRedis().del(...keys);
        },
      };
    },
  },
  postgres: {
    skip: () => missing('postgres'),
    async make() {
      const schema = uniqueName('kill');
      await new idempo.PostgresStore({ pool: sharedPgPool(), schema }).createSchema();
      return { where: PG_DSN, namespace: schema, cleanup: async () => sharedPgPool().query(`DROP SCHEMA "${schema}" CASCADE`) };
    },
  },
};

function deliver(kind, t, log, takeover, message) {
  const child = spawn(process.execPath, [consumer, kind, t.where, t.namespace, log, takeover, JSON.stringify(message)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (d) => { out += d; });
  child.stderr.on('data', (d) => { err += d; });
  const done = new Promise((resolve) => child.on('close', (code, signal) => resolve({ code, signal, out: out.trim(), err })));
  return { child, done };
}

function runs(log) {
  return fs.existsSync(log) ? fs.readFileSync(log, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l)) : [];
}

async function until(what, deadlineMs) {
  const end = Date.now() + deadlineMs;
  while (!what()) {
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 50));
  }
}

for (const takeover of ['outcome_unknown', 're_run']) {
  for (const kind of ['sqlite', 'redis', 'postgres']) {
    const t0 = targets[kind];
    test(`${kind}, takeover ${takeover}: kill -9 mid-function, then redeliveries`, { skip: t0.skip() ?? false }, async () => {
      const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-kill-'));
      const log = path.join(dir, 'runs.log');
      const t = await t0.make(dir);
      const first = deliver(kind, t, log, takeover, { id: 'm-1', hang: true });
      try {
        await until(() => runs(log).length === 1, 20_000);
        // Redelivered while the first consumer's heartbeats keep its lease: in flight, not run.
        const busy = await deliver(kind, t, log, takeover, { id: 'm-1' }).done;
        assert.equal(busy.out, 'ERROR CallInFlightError', busy.err);
        assert.equal(runs(log).length, 1);
        first.child.kill('SIGKILL');
        const killed = await first.done;
        assert.equal(killed.signal, 'SIGKILL');
        await new Promise((r) => setTimeout(r, 1500)); // the 1 s lease ends without heartbeats
        const second = await deliver(kind, t, log, takeover, { id: 'm-1' }).done;
        if (takeover === 'outcome_unknown') {
          assert.equal(second.out, 'ERROR CallOutcomeUnknownError', second.err);
          assert.equal(runs(log).length, 1); // never run twice
        } else {
          assert.equal(second.out, 'RESULT done', second.err);
          const [a, b] = runs(log);
          assert.equal(runs(log).length, 2);
          assert.notEqual(a.pid, b.pid);
          assert.equal(a.downstream, b.downstream); // a downstream-keyed effect deduplicates
        }
        const third = await deliver(kind, t, log, takeover, { id: 'm-1' }).done;
        assert.equal(third.out, takeover === 'outcome_unknown' ? 'ERROR CallOutcomeUnknownError' : 'RESULT done', third.err);
        assert.equal(runs(log).length, takeover === 'outcome_unknown' ? 1 : 2);
      } finally {
        if (first.child.exitCode === null && first.child.signalCode === null) first.child.kill('SIGKILL');
        await t.cleanup();
        fs.rmSync(dir, { recursive: true, force: true });
      }
    });
  }
}
