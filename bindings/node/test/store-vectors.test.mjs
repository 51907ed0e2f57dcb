// spec/vectors/store/: every conformance scenario against every store (real PostgreSQL/Redis).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { vectorFiles, storeKinds, closeShared } from './helpers.mjs';

const scenarios = vectorFiles('store');
after(closeShared);

test('store scenarios are present', () => {
  assert.ok(scenarios.length >= 10, `expected the store scenarios, found ${scenarios.length}`);
});

function checkRecord(actual, want, v, t0, where) {
  if (want === null) {
    assert.equal(actual, null, `${where}: expected no record`);
    return;
  }
  assert.ok(actual, `${where}: expected a record`);
  assert.equal(actual.fingerprint, want.fingerprint, `${where}: fingerprint`);
  assert.equal(actual.state, want.state, `${where}: state`);
  assert.equal(actual.token.toString('hex'), v.tokens[want.token], `${where}: token`);
  if (want.generation_restart_allowed && actual.generation === 1) {
    // A store whose expired rows are already gone restarts at 1 (allowed by the contract).
  } else {
    assert.equal(actual.generation, want.generation, `${where}: generation`);
  }
  assert.equal(actual.leaseUntil === null ? null : actual.leaseUntil - t0, want.lease_until_ms, `${where}: lease_until`);
  assert.equal(actual.expiresAt - t0, want.expires_at_ms, `${where}: expires_at`);
  if (want.response === null) assert.equal(actual.response, null, `${where}: response`);
  else assert.equal(actual.response?.toString('hex'), v.responses[want.response], `${where}: response bytes`);
}

async function runScenario(kind, v) {
  const t0 = 1_800_000_000_000;
  let elapsed = 0;
  const { store, cleanup } = await storeKinds[kind].make(() => t0 + elapsed);
  const scope = (n) => Buffer.from(v.scopes[n], 'hex');
  const tok = (n) => Buffer.from(v.tokens[n], 'hex');
  const resp = (n) => Buffer.from(v.responses[n], 'hex');
  try {
    for (const [i, s] of v.steps.entries()) {
      const where = `${v.name} step ${i} (${s.op ?? 'advance'})`;
      if (s.advance_ms !== undefined) {
        elapsed += s.advance_ms;
        continue;
      }
      const e = s.expect;
      switch (s.op) {
        case 'claim': {
          const r = await store.claim(scope(s.scope), s.fingerprint, tok(s.token), s.lease_ms, s.ttl_ms);
          assert.equal(r.nowMs - t0, e.now_ms, `${where}: now`);
          if (e.claimed) {
            assert.equal(r.claimed, true, `${where}: claimed`);
            if (!(e.claimed.restart_allowed && r.generation === 1)) assert.equal(r.generation, e.claimed.generation, `${where}: generation`);
          } else {
            assert.equal(r.claimed, false, `${where}: existing`);
            checkRecord(r.record, e.existing, v, t0, where);
          }
          break;
        }
        case 'get': {
          const r = await store.get(scope(s.scope));
          checkRecord(r.record, e.record, v, t0, where);
          break;
        }
        case 'takeover':
          assert.equal(await store.takeover(scope(s.scope), tok(s.seen_token), tok(s.new_token), s.lease_ms), e.generation, where);
          break;
        case 'mark_unknown':
          assert.equal(await store.markUnknown(scope(s.scope), tok(s.seen_token), s.ttl_ms), e.applied, where);
          break;
        case 'complete':
          assert.equal(await store.complete(scope(s.scope), tok(s.token), resp(s.response), s.ttl_ms), e.applied, where);
          break;
        case 'release':
          assert.equal(await store.release(scope(s.scope), tok(s.token)), e.applied, where);
          break;
        case 'renew':
          assert.equal(await store.renew(scope(s.scope), tok(s.token), s.lease_ms), e.applied, where);
          break;
        case 'purge_expired': {
          const c = await store.purgeExpired({ batch: s.batch });
          assert.deepEqual(
            { in_progress: c.inProgress, completed: c.completed, outcome_unknown: c.outcomeUnknown },
            e,
            where,
          );
          break;
        }
        default:
          throw new Error(`${where}: unknown op ${s.op}`);
      }
    }
  } finally {
    await cleanup();
  }
}

for (const kind of Object.keys(storeKinds)) {
  test(`store vectors: ${kind}`, { skip: storeKinds[kind].skip() ?? false }, async (t) => {
    for (const { file, data } of scenarios) {
      const needsPurge = (data.requires ?? []).includes('purge');
      await t.test(file, { skip: needsPurge && storeKinds[kind].noPurge ? 'store expires records itself' : false }, () =>
        runScenario(kind, data),
      );
    }
  });
}
