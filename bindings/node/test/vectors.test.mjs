// The shared vectors of spec/vectors/ (key, scope, retry, canonical, fingerprint, machine), read at
// run time and compared byte for byte with what the package computes through the addon.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo, vectorFiles, loadVector } from './helpers.mjs';

const require = createRequire(import.meta.url);
const native = require('../native/index.js');

const hexOrText = (c, textKey, hexKey) => (c[hexKey] !== undefined ? Buffer.from(c[hexKey], 'hex') : Buffer.from(c[textKey], 'utf8'));
const keyOpts = (o) => ({ minLen: o.min_len, maxLen: o.max_len, strict: o.strict });

test('key/parse.json', () => {
  const v = loadVector('key', 'parse.json');
  assert.ok(v.cases.length > 0);
  for (const c of v.cases) {
    const input = hexOrText(c, 'input', 'input_hex');
    if (c.expect.error) {
      assert.throws(
        () => idempo.parseKeyDetailed(input, keyOpts(c.options)),
        (e) => {
          assert.ok(e instanceof idempo.IdempotencyKeyInvalidError, c.name);
          assert.equal(e.code, 'IDEMPOTENCY_KEY_INVALID');
          assert.equal(e.reason, c.expect.error, c.name);
          if (c.expect.offset !== undefined) assert.equal(e.offset, c.expect.offset, `${c.name} offset`);
          assert.match(e.message, /^[\x20-\x7e]*$/, `${c.name}: printable ASCII message`);
          return true;
        },
        c.name,
      );
    } else {
      const p = idempo.parseKeyDetailed(input, keyOpts(c.options));
      assert.equal(p.key, c.expect.key, c.name);
      assert.equal(p.form, c.expect.form, c.name);
      assert.equal(p.ignoredParameters, c.expect.ignored_parameters, c.name);
      assert.equal(idempo.keyHeaderValue(p.key), c.expect.header_value, c.name);
      assert.equal(idempo.parseKey(c.expect.header_value, { strict: true, minLen: 1, maxLen: 255 }), p.key, `${c.name}: round trip`);
    }
  }
});

test('key/options.json', () => {
  for (const c of loadVector('key', 'options.json').cases) {
    const run = () => idempo.parseKey('"abcdefgh"', { minLen: c.min_len, maxLen: c.max_len });
    if (c.expect === 'ok') {
      try {
        run();
      } catch (e) {
        assert.ok(e instanceof idempo.IdempotencyKeyInvalidError, `${c.name}: options accepted`);
      }
    } else {
      assert.throws(run, (e) => e instanceof idempo.ConfigError && e.reason === c.expect, c.name);
    }
  }
});

test('key/generate.json', () => {
  for (const c of loadVector('key', 'generate.json').cases) {
    assert.equal(native.generateKey(Buffer.from(c.entropy_hex, 'hex')), c.key, c.name);
  }
  assert.match(idempo.generateKey(), /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
});

test('scope/scope.json', () => {
  const v = loadVector('scope', 'scope.json');
  for (const c of v.cases) {
    assert.equal(idempo.scopeIdHex(c.principal, c.method, c.route, c.key), c.scope_hex, c.name);
    assert.equal(idempo.scopeId(c.principal, c.method, c.route, c.key).toString('hex'), c.scope_hex, c.name);
  }
});

const jitterValue = (j) => (j === 'NaN' ? NaN : j === 'Infinity' ? Infinity : j === '-Infinity' ? -Infinity : j);
const policyOpts = (p) => ({
  maxAttempts: p.max_attempts,
  baseDelayMs: p.base_delay_ms,
  maxDelayMs: p.max_delay_ms,
  maxElapsedMs: p.max_elapsed_ms,
  jitter: p.jitter,
});

test('retry/decide.json', () => {
  const v = loadVector('retry', 'decide.json');
  let n = 0;
  for (const g of v.groups) {
    const policy = new idempo.RetryPolicy(policyOpts(g.policy));
    for (const c of g.cases) {
      n++;
      const o =
        c.outcome.kind === 'response'
          ? { kind: 'response', status: c.outcome.status, retryAfterMs: c.outcome.retry_after_ms }
          : c.outcome.kind === 'in_flight'
            ? { kind: 'in_flight', retryAfterMs: c.outcome.retry_after_ms }
            : { kind: c.outcome.kind };
      const where = `${g.name}/${c.name}`;
      if (c.expect.error) {
        assert.throws(() => policy.decide(c.attempt, c.elapsed_ms, o, jitterValue(c.jitter)), (e) => e.reason === c.expect.error, where);
        continue;
      }
      const d = policy.decide(c.attempt, c.elapsed_ms, o, jitterValue(c.jitter));
      if (c.expect.retry !== undefined) assert.deepEqual(d, { retry: true, delayMs: c.expect.retry }, where);
      else {
        const want = { retry: false, reason: c.expect.stop };
        if (c.expect.status !== undefined) want.status = c.expect.status;
        const { settlesIntent: _settles, ...stop } = d; // pinned by spec/vectors/intent/settle.json
        assert.deepEqual(stop, want, where);
      }
    }
  }
  assert.ok(n > 20);
});

test('retry/outcome.json', () => {
  const policy = new idempo.RetryPolicy();
  const cases = loadVector('retry', 'outcome.json').cases;
  assert.ok(cases.length > 10);
  for (const c of cases) {
    const body = new TextEncoder().encode(c.body);
    const d = policy.decide(1, 0, { kind: 'response', status: c.status, retryAfterMs: c.retry_after_ms, contentType: c.content_type, body }, 0.5);
    const stops = { outcome_unknown: 'outcome_unknown', key_reused: 'key_reused_with_different_request', response_not_retained: 'response_not_retained' };
    if (stops[c.expect]) {
      assert.equal(idempo.responseBodyNeeded(c.status, c.content_type), true, c.name);
      const { settlesIntent: _settles, ...stop } = d; // pinned by spec/vectors/intent/settle.json
      assert.deepEqual(stop, { retry: false, reason: stops[c.expect] }, c.name);
    } else if (c.expect === 'in_flight') {
      assert.equal(idempo.responseBodyNeeded(c.status, c.content_type), true, c.name);
      const bare = policy.decide(1, 0, { kind: 'in_flight', retryAfterMs: c.retry_after_ms }, 0.5);
      assert.equal(bare.retry, true, c.name);
      assert.deepEqual(d, bare, c.name);
    } else {
      assert.equal(c.expect, 'response', c.name);
      const bare = policy.decide(1, 0, { kind: 'response', status: c.status, retryAfterMs: c.retry_after_ms }, 0.5);
      assert.deepEqual(d, bare, c.name);
    }
  }
});

test('retry/config.json', () => {
  for (const c of loadVector('retry', 'config.json').cases) {
    if (c.expect === 'ok') new idempo.RetryPolicy(policyOpts(c.policy));
    else assert.throws(() => new idempo.RetryPolicy(policyOpts(c.policy)), (e) => e instanceof idempo.ConfigError && e.reason === c.expect, c.name);
  }
});

test('retry/retry_after.json', () => {
  for (const c of loadVector('retry', 'retry_after.json').cases) {
    assert.equal(idempo.parseRetryAfter(c.value, c.now_ms), c.expect_ms, c.name);
  }
});

test('canonical/*.json', () => {
  const files = vectorFiles('canonical');
  assert.ok(files.length >= 5, 'canonical vectors present');
  let n = 0;
  for (const { file, data } of files) {
    for (const c of data.cases) {
      n++;
      const input = hexOrText(c, 'input', 'input_hex');
      const opts = { numbers: c.mode };
      if (c.limits?.max_input_bytes !== undefined) opts.maxInputBytes = c.limits.max_input_bytes;
      if (c.limits?.max_depth !== undefined) opts.maxDepth = c.limits.max_depth;
      if (c.limits?.max_members !== undefined) opts.maxMembers = c.limits.max_members;
      if (c.exclude) opts.exclude = c.exclude;
      const where = `${file}/${c.name}`;
      if (c.error) {
        assert.throws(
          () => idempo.canonicalize(input, opts),
          (e) => {
            assert.ok(e instanceof idempo.CanonicalizationError, where);
            assert.equal(e.reason, c.error.code, `${where} code`);
            assert.equal(e.offset, c.error.offset, `${where} offset`);
            assert.equal(e.pointer, c.error.pointer, `${where} pointer`);
            return true;
          },
          where,
        );
      } else {
        assert.equal(idempo.canonicalize(input, opts).toString('hex'), Buffer.from(c.output, 'utf8').toString('hex'), where);
      }
    }
  }
  assert.ok(n > 50);
});

test('fingerprint/fingerprint.json', () => {
  const v = loadVector('fingerprint', 'fingerprint.json');
  for (const c of v.cases) {
    const cfg = c.config ?? {};
    const o = {};
    if (cfg.header_names) o.headers = cfg.header_names;
    if (cfg.exclude) o.exclude = cfg.exclude;
    if (cfg.numbers) o.numbers = cfg.numbers;
    if (cfg.hmac_key_hex !== undefined) o.hmacKey = Buffer.from(cfg.hmac_key_hex, 'hex');
    const r = c.request;
    const req = { method: r.method, route: r.route, headers: r.headers, contentType: r.content_type, body: hexOrText(r, 'body', 'body_hex') };
    const run = () => new idempo.Fingerprinter(o).fingerprint(req);
    if (c.error) {
      assert.throws(run, (e) => e.reason === c.error.code && (c.error.offset === undefined || e.offset === c.error.offset), c.name);
    } else {
      assert.equal(run(), c.fingerprint, c.name);
      const one = { ...req, headerNames: o.headers, exclude: o.exclude, numbers: o.numbers, hmacKey: o.hmacKey };
      assert.equal(idempo.fingerprint(one), c.fingerprint, `${c.name} (one-shot)`);
      if (!o.headers && r.content_type && /json/.test(r.content_type) && c.request.body !== undefined && r.content_type === 'application/json') {
        assert.equal(new idempo.Fingerprinter(o).fingerprintJson(r.method, r.route, req.body), c.fingerprint, `${c.name} (hot path)`);
        assert.equal(new idempo.Fingerprinter(o).forRoute(r.method, r.route)(req.body), c.fingerprint, `${c.name} (route-bound)`);
      }
    }
  }
});

// ---- machine: the sans-IO flow through the addon, event by event.

function flowConfig(c) {
  return new native.FlowConfig({
    takeover: c.takeover,
    leaseMs: c.lease_ms,
    heartbeatMs: c.heartbeat_ms === null ? 0 : c.heartbeat_ms,
    ttlMs: c.ttl_ms,
    transientStatuses: c.transient_statuses,
    storeServerErrors: c.store_server_errors,
    maxStoredBodyBytes: c.max_body_bytes,
    storedHeaders: c.stored_headers,
    inFlightRetryAfterMs: c.in_flight_retry_after_ms,
    unavailableRetryAfterMs: c.unavailable_retry_after_ms,
    maxStoreRounds: c.max_store_rounds,
    transactional: c.transactional === true,
    ...(c.cleanup_budget_ms === undefined ? {} : { cleanupBudgetMs: c.cleanup_budget_ms }),
  });
}

function row(r) {
  if (r === null) return null;
  const out = { fingerprint: r.fingerprint, state: r.state, token: Buffer.from(r.token, 'hex'), generation: r.generation, expiresAt: r.expires_at_ms };
  if (r.lease_until_ms !== null) out.leaseUntil = r.lease_until_ms;
  if (r.response) {
    out.response = idempo.encodeResponse({ status: r.response.status, headers: r.response.headers, body: Buffer.from(r.response.body, 'utf8') });
  }
  return out;
}

function feed(flow, e) {
  switch (e.type) {
    case 'claimed': return flow.claimed(e.generation, e.now_ms);
    case 'existing': return flow.existing(row(e.record), e.now_ms);
    case 'got': return flow.got(row(e.record), e.now_ms);
    case 'took_over': return flow.tookOver(e.generation);
    case 'marked_unknown': return flow.markedUnknown(e.applied);
    case 'completed': return flow.completed(e.applied);
    case 'released': return flow.released(e.applied);
    case 'renewed': return flow.renewed(e.applied);
    case 'committed': return flow.committed();
    case 'locked': return flow.locked(e.now_ms);
    case 'store_failed': return flow.storeFailed();
    case 'heartbeat_due': return flow.heartbeatDue();
    case 'handler_finished':
      return flow.handlerFinished(
        e.status,
        e.headers,
        Buffer.from(e.body, 'utf8'),
        e.body_to_store === null ? null : Buffer.from(e.body_to_store, 'utf8'),
        (e.origin ?? 'handler') === 'framework',
        e.body_truncated ?? false,
      );
    case 'handler_failed': return flow.handlerFailed(e.maybe_side_effect);
    default: throw new Error(`unknown event ${e.type}`);
  }
}

function check(a, want, v, where) {
  assert.equal(a.type, want.action, `${where}: action`);
  const hex = (b) => (b ? Buffer.from(b).toString('hex') : undefined);
  switch (want.action) {
    case 'store':
      assert.equal(a.op, want.op, `${where}: op`);
      assert.equal(hex(a.scope), v.scope, `${where}: scope`);
      if ('fingerprint' in want) assert.equal(a.fingerprint, want.fingerprint, where);
      if ('token' in want) assert.equal(hex(a.token), want.token, `${where}: token`);
      if ('seen_token' in want) assert.equal(hex(a.seenToken), want.seen_token, `${where}: seen`);
      if ('new_token' in want) assert.equal(hex(a.newToken), want.new_token, `${where}: new`);
      if ('lease_ms' in want) assert.equal(a.leaseMs, want.lease_ms, `${where}: lease`);
      if ('ttl_ms' in want) assert.equal(a.ttlMs, want.ttl_ms, `${where}: ttl`);
      if ('response_hex' in want) assert.equal(hex(a.response), want.response_hex, `${where}: response bytes`);
      break;
    case 'run_handler':
      assert.equal(hex(a.token), want.token, where);
      assert.equal(a.generation, want.generation, where);
      assert.equal(a.downstreamKey, want.downstream_key, where);
      assert.equal(a.heartbeatMs ?? null, want.heartbeat_ms, where);
      break;
    case 'respond': {
      assert.equal(a.outcome, want.outcome, `${where}: outcome`);
      assert.equal(a.http.status, want.status, `${where}: status`);
      assert.deepEqual(a.http.headers, want.headers, `${where}: headers`);
      if ('body' in want) assert.equal(a.http.body.toString('utf8'), want.body, `${where}: body`);
      if (want.problem) {
        const p = JSON.parse(a.http.body.toString('utf8'));
        assert.equal(p.type, want.problem.type, where);
        assert.equal(p.status, want.problem.status, where);
        assert.equal(typeof p.title, 'string');
        assert.equal(typeof p.detail, 'string');
      }
      break;
    }
    case 'propagate_error':
      assert.equal(a.outcome, want.outcome, where);
      break;
    default:
      break;
  }
}

for (const { file, data: v } of vectorFiles('machine')) {
  test(`machine/${file}`, () => {
    const flow = new native.ServerFlow(flowConfig(v.config), Buffer.from(v.scope, 'hex'), v.fingerprint, Buffer.from(v.entropy, 'hex'));
    for (const [i, s] of v.steps.entries()) {
      const where = `${v.name} step ${i}`;
      if (i === 0) {
        check(flow.start(), s.expect, v, where);
        continue;
      }
      if (s.expect.error) {
        assert.throws(() => feed(flow, s.event), (e) => e.code === 'FLOW_ERROR' && e.reason === s.expect.error, where);
        continue;
      }
      check(feed(flow, s.event), s.expect, v, where);
      if (flow.finished) {
        // A finished flow's cleanup (absent in the script: none).
        const c = flow.cleanup;
        if (!s.expect.cleanup) {
          assert.equal(c ?? null, null, `${where}: unexpected cleanup`);
        } else {
          const { budget_ms: budget, ...op } = s.expect.cleanup;
          assert.ok(c, `${where}: no cleanup`);
          assert.equal(c.budgetMs, budget, `${where}: budget`);
          check(c.action, { action: 'store', ...op }, v, `${where} cleanup`);
        }
      }
    }
    for (const [i, cs] of (v.cleanup_steps ?? []).entries()) {
      const applied = cs.event.type === 'store_failed' ? null : cs.event.applied;
      const got = flow.cleanupNext(cs.attempt, cs.elapsed_ms, applied);
      assert.equal(got ?? 'done', cs.expect === 'done' ? 'done' : cs.expect.retry_after_ms, `${v.name} cleanup step ${i}`);
    }
  });
}

test('machine vectors are present', () => {
  assert.ok(vectorFiles('machine').length >= 20);
  assert.ok(vectorFiles('machine').filter((f) => f.file.startsWith('tx_')).length >= 12);
});
