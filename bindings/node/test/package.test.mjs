// Packaging: the ESM facade and the CommonJS build are one instance; errors are typed; bad input
// never crashes the process.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import * as esm from 'idempo';

const require = createRequire(import.meta.url);
const cjs = require('idempo');

test('ESM and CommonJS entry points expose the same, single instance', () => {
  const names = Object.keys(cjs).filter((n) => n !== '__esModule').sort();
  assert.deepEqual(Object.keys(esm).filter((n) => n !== 'default').sort(), names);
  assert.equal(esm.IdempoError, cjs.IdempoError);
  assert.equal(esm.canonicalize, cjs.canonicalize);
  assert.ok(names.length > 30);
});

test('every error is an Error subclass with a stable code', () => {
  const cases = [
    [() => cjs.parseKey('"x"'), cjs.IdempotencyKeyInvalidError, 'IDEMPOTENCY_KEY_INVALID'],
    [() => cjs.canonicalize('[1,]'), cjs.CanonicalizationError, 'CANONICALIZATION_ERROR'],
    [() => cjs.decodeResponse(Buffer.from('idr\x09')), cjs.RecordCorruptError, 'RECORD_CORRUPT'],
    [() => new cjs.Fingerprinter({ exclude: ['no-slash'] }), cjs.FingerprintError, 'FINGERPRINT_ERROR'],
    [() => new cjs.Fingerprinter({ hmacKey: Buffer.alloc(0) }), cjs.FingerprintError, 'FINGERPRINT_ERROR'],
    [() => new cjs.RetryPolicy({ jitter: 'wild' }), cjs.ConfigError, 'CONFIG_INVALID'],
    [() => cjs.idempotency({ store: new cjs.MemoryStore(), leaseMs: 10 }), cjs.ConfigError, 'CONFIG_INVALID'],
  ];
  for (const [run, cls, code] of cases) {
    assert.throws(run, (e) => e instanceof cls && e instanceof cjs.IdempoError && e instanceof Error && e.code === code && e.name === cls.name);
  }
  const c = (() => {
    try {
      cjs.canonicalize('{"a":{"b":[1,2,01]}}');
    } catch (e) {
      return e;
    }
  })();
  assert.equal(c.reason, 'leading_zero');
  assert.equal(c.pointer, '/a/b/2');
  assert.equal(c.offset, 15);
  for (const [Cls, code] of [
    [cjs.IdempotencyKeyMissingError, 'IDEMPOTENCY_KEY_MISSING'],
    [cjs.IdempotencyKeyInUseError, 'IDEMPOTENCY_KEY_IN_USE'],
    [cjs.IdempotencyKeyReusedError, 'IDEMPOTENCY_KEY_REUSED'],
    [cjs.OutcomeUnknownError, 'OUTCOME_UNKNOWN'],
    [cjs.LeaseLostError, 'LEASE_LOST'],
  ]) {
    assert.equal(new Cls().code, code);
  }
  assert.equal(new cjs.StoreUnavailableError('down', { retryAfterMs: 1000 }).retryAfterMs, 1000);
});

test('hostile input never crashes the process', () => {
  const native = require('../native/index.js');
  const junk = [undefined, null, 42, 'text', {}, [], Buffer.alloc(0), Buffer.alloc(100_000, 0xff), new Uint16Array(4), -1, NaN, 2 ** 60];
  let threw = 0;
  for (const a of junk) {
    for (const b of junk) {
      for (const fn of [native.canonicalizeBytes, native.parseKeyBytes, native.generateKey, native.decodeResponse, native.scopeId, native.Admission.start, native.checkRecordRow, native.parseRetryAfter]) {
        try {
          fn(a, b, a, b);
        } catch (e) {
          assert.ok(e instanceof Error);
          threw++;
        }
      }
    }
  }
  assert.ok(threw > 100);
  const flow = new native.ServerFlow(new native.FlowConfig(), Buffer.alloc(32), `v1:${'0'.repeat(64)}`, Buffer.alloc(16));
  flow.start();
  assert.throws(() => flow.completed(true), (e) => e.code === 'FLOW_ERROR' && e.reason === 'unexpected_event');
  const g = flow.existing({ fingerprint: 'v1:zz', state: 9, token: Buffer.alloc(3), generation: -4, expiresAt: 1.5 }, 0);
  assert.equal(g.type, 'respond', 'a garbage row fails closed');
  assert.equal(g.http.status, 503);
  assert.throws(() => flow.storeFailed(), (e) => e.code === 'FLOW_ERROR' && e.reason === 'finished');
  const flow2 = new native.ServerFlow(new native.FlowConfig(), Buffer.alloc(32), `v1:${'0'.repeat(64)}`, Buffer.alloc(16));
  flow2.start();
  const a = flow2.existing({ fingerprint: `v1:${'0'.repeat(64)}`, state: 2, token: Buffer.alloc(16), generation: 1, expiresAt: 10 ** 13 }, 5);
  assert.equal(a.type, 'respond', 'a corrupt row (completed without response) fails closed');
  assert.equal(a.http.status, 503);
  assert.match(a.corrupt, /./);
});

test('the generated native declarations are real', async () => {
  const fs = await import('node:fs');
  const dts = fs.readFileSync(new URL('../native/index.d.ts', import.meta.url), 'utf8');
  for (const decl of ['export declare class ServerFlow', 'export declare class Fingerprinter', 'export declare function canonicalizeBytes', 'export declare class MemoryStoreCore', 'fingerprintJson(method: string, route: string, body: Uint8Array): string']) {
    assert.ok(dts.includes(decl), decl);
  }
});

test('forRoute: the route-bound function agrees with fingerprintJson, takes strings, refuses other types', () => {
  const fp = new esm.Fingerprinter();
  const route = fp.forRoute('POST', '/payments');
  const body = '{"b":[1,2.5,"é"],"a":{"y":null,"x":true}}';
  const want = fp.fingerprintJson('POST', '/payments', Buffer.from(body));
  assert.equal(route(Buffer.from(body)), want);
  assert.equal(route(new Uint8Array(Buffer.from(body))), want);
  assert.equal(route(body), want);
  assert.notEqual(fp.forRoute('POST', '/other')(body), want);
  assert.throws(() => route(42), (e) => e instanceof TypeError && /got number/.test(e.message));
  assert.throws(() => route(null), (e) => e instanceof TypeError && /got null/.test(e.message));
  assert.throws(() => route('{"a":1,"a":2}'), (e) => e instanceof esm.CanonicalizationError && e.code === 'CANONICALIZATION_ERROR');
  assert.throws(() => new esm.Fingerprinter({ headers: ['x-a'] }).forRoute('POST', '/p'), TypeError);
});
