// Idempotent functions in transactional mode (spec/PROTOCOL.md §7.6, §13): the function's writes
// through `currentCall().tx` (or `currentTransaction()`) commit with the stored result, or roll
// back with the claim; a redelivery of a completed call replays without writing; a failure leaves
// no row and the key free, so the redelivery runs once more and commits. Real SQLite and
// PostgreSQL.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { closeShared, idempo, txStoreKinds, uniqueName } from './helpers.mjs';

after(closeShared);

for (const [kind, k] of Object.entries(txStoreKinds)) {
  test(`transactional function (${kind}): the job's row commits with the result, once`, { skip: k.skip }, async () => {
    const t = await k.make();
    let runs = 0;
    try {
      const pay = idempo.idempotent(
        async (msg) => {
          runs += 1;
          const call = idempo.currentCall();
          assert.ok(call.tx, 'the open transaction');
          assert.equal(idempo.currentTransaction(), call.tx);
          await t.insert(call.tx, msg.id);
          return { paid: msg.id };
        },
        { store: t.store, name: uniqueName('pay'), key: (m) => m.id, transactional: true },
      );
      assert.deepEqual(await pay({ id: 'm-1' }), { paid: 'm-1' });
      assert.deepEqual(await pay({ id: 'm-1' }), { paid: 'm-1' });
      assert.equal(runs, 1);
      assert.equal(await t.count('m-1'), 1);
      assert.equal(await t.records(), 1);
    } finally {
      await t.cleanup();
    }
  });

  test(`transactional function (${kind}): a failure rolls its row back and frees the key`, { skip: k.skip }, async () => {
    const t = await k.make();
    let runs = 0;
    try {
      const pay = idempo.idempotent(
        async (msg) => {
          runs += 1;
          await t.insert(idempo.currentCall().tx, msg.id);
          if (runs === 1) throw new Error('the provider timed out');
          return { paid: msg.id };
        },
        { store: t.store, name: uniqueName('pay'), key: (m) => m.id, transactional: true },
      );
      await assert.rejects(pay({ id: 'm-2' }), /the provider timed out/);
      assert.equal(await t.count('m-2'), 0, 'the failed run wrote nothing');
      assert.equal(await t.records(), 0, 'the key is free again');
      assert.deepEqual(await pay({ id: 'm-2' }), { paid: 'm-2' });
      assert.equal(runs, 2);
      assert.equal(await t.count('m-2'), 1);
    } finally {
      await t.cleanup();
    }
  });
}

test('transactional function: a store without transactions is refused when wrapping', () => {
  assert.throws(
    () => idempo.idempotent(async () => 1, { store: new idempo.MemoryStore(), name: 'x', transactional: true }),
    (e) => e instanceof idempo.TransactionalUnsupportedError && /PostgresStore or SqliteStore/.test(e.message),
  );
});
