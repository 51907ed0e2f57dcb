// Express integration (issue 14): route identity under app.use, body parsers before and after the
// middleware (Express 4 and 5), mounting on a method the middleware does not protect, and the
// cross-tenant matrix. Real Express servers on 127.0.0.1, driven by fetch.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo } from './helpers.mjs';

const require = createRequire(import.meta.url);
const expresses = { express5: require('express'), express4: require('express4') };

async function listen(app) {
  const server = await new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () => resolve(s));
  });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(r);
      }),
  };
}

function send(url, key, body, headers = {}, method = 'POST') {
  const h = { 'content-type': 'application/json', ...headers };
  if (key !== undefined) h['idempotency-key'] = key;
  return fetch(url, { method, headers: h, body: typeof body === 'string' ? body : JSON.stringify(body) });
}

for (const [name, express] of Object.entries(expresses)) {
  test(`${name}: app.use(idempotency()): /payments, /payments/ and /PAYMENTS share one key (the handler runs once)`, async () => {
    const app = express();
    app.use(idempo.idempotency({ store: new idempo.MemoryStore() }));
    let runs = 0;
    app.post('/payments', (req, res) => res.status(201).json({ run: ++runs, amount: req.body.amount }));
    const srv = await listen(app);
    try {
      const key = idempo.generateKey();
      const statuses = [];
      for (const path of ['/payments', '/payments/', '/PAYMENTS', '/Payments/']) {
        const r = await send(`${srv.url}${path}`, key, { amount: 5 });
        statuses.push(r.status);
        await r.arrayBuffer();
      }
      assert.equal(runs, 1, `one key, one execution (statuses ${statuses})`);
      assert.equal(statuses[0], 201);
      assert.equal(statuses[1], 201, 'the trailing slash is the same target: a replay');
    } finally {
      await srv.close();
    }
  });

  test(`${name}: app.use under 'strict routing' and 'case sensitive routing' keeps the paths apart as the router does`, async () => {
    const app = express();
    app.set('strict routing', true);
    app.set('case sensitive routing', true);
    app.use(idempo.idempotency({ store: new idempo.MemoryStore() }));
    let runs = 0;
    app.post('/payments', (_req, res) => res.status(201).json({ where: 'lower', run: ++runs }));
    app.post('/PAYMENTS', (_req, res) => res.status(201).json({ where: 'upper', run: ++runs }));
    const srv = await listen(app);
    try {
      const key = idempo.generateKey();
      const a = await (await send(`${srv.url}/payments`, key, {})).json();
      const b = await (await send(`${srv.url}/PAYMENTS`, key, {})).json();
      assert.deepEqual([a.where, b.where], ['lower', 'upper'], 'two handlers, two routes, two records');
    } finally {
      await srv.close();
    }
  });

  test(`${name}: per-route mounting: one route template, whatever the trailing slash or case`, async () => {
    const app = express();
    let runs = 0;
    app.post('/orders/:id', idempo.idempotency({ store: new idempo.MemoryStore() }), (req, res) => res.status(201).json({ id: req.params.id, run: ++runs }));
    const srv = await listen(app);
    try {
      const key = idempo.generateKey();
      for (const path of ['/orders/A1', '/orders/A1/', '/ORDERS/A1']) await (await send(`${srv.url}${path}`, key, {})).arrayBuffer();
      assert.equal(runs, 1);
      // Another resource under the same template with the same key: never a replay of the first.
      const other = await send(`${srv.url}/orders/B2`, key, {});
      assert.equal(other.status, 422);
    } finally {
      await srv.close();
    }
  });

  for (const place of ['before', 'after']) {
    test(`${name}: express.json()/urlencoded()/text() mounted ${place} the middleware`, async () => {
      const app = express();
      const mw = idempo.idempotency({ store: new idempo.MemoryStore() });
      const verify = place === 'before' ? { verify: idempo.keepRawBody } : {};
      const parsers = [express.json(verify), express.urlencoded({ extended: false, ...verify }), express.text(verify)];
      if (place === 'before') app.use(...parsers, mw);
      else app.use(mw, ...parsers);
      let runs = 0;
      app.post('/p', (req, res) => res.status(201).json({ run: ++runs, body: req.body, isBuffer: Buffer.isBuffer(req.body) }));
      const srv = await listen(app);
      try {
        const cases = [
          ['application/json', '{"amount":10}', { amount: 10 }, '{"amount":9999}'],
          ['application/x-www-form-urlencoded', 'amount=10', { amount: '10' }, 'amount=9999'],
          ['text/plain', 'amount=10', 'amount=10', 'amount=9999'],
        ];
        for (const [ct, body, parsed, other] of cases) {
          const key = idempo.generateKey();
          const r1 = await send(`${srv.url}/p`, key, body, { 'content-type': ct });
          assert.equal(r1.status, 201, ct);
          const b1 = await r1.json();
          assert.equal(b1.isBuffer, false, `${ct}: the handler gets the parser's value, never raw bytes`);
          assert.deepEqual(b1.body, parsed, ct);
          const again = await send(`${srv.url}/p`, key, body, { 'content-type': ct });
          assert.equal(again.headers.get('idempotent-replayed'), 'true', ct);
          const changed = await send(`${srv.url}/p`, key, other, { 'content-type': ct });
          assert.equal(changed.status, 422, `${ct}: another body with the same key is a mismatch, never a replay`);
        }
        assert.equal(runs, 3);
      } finally {
        await srv.close();
      }
    });
  }

  test(`${name}: a parser before the middleware without keepRawBody: 500 body-unavailable naming the fix, nothing runs`, async () => {
    const app = express();
    const mw = idempo.idempotency({ store: new idempo.MemoryStore() });
    const logs = [];
    const origError = console.error;
    console.error = (m) => logs.push(String(m));
    app.use(express.json(), express.text(), mw);
    let runs = 0;
    app.post('/p', (_req, res) => res.status(201).json({ run: ++runs }));
    const srv = await listen(app);
    try {
      for (const [ct, body] of [['application/json', '{"amount":10}'], ['text/plain', 'amount=10']]) {
        const r = await send(`${srv.url}/p`, idempo.generateKey(), body, { 'content-type': ct });
        assert.equal(r.status, 500, ct);
        assert.match(r.headers.get('content-type'), /application\/problem\+json/);
        const p = await r.json();
        assert.equal(p.type, 'urn:idempo:problem:body-unavailable');
        assert.match(p.detail, /keepRawBody/);
      }
      // A body the parser did not read (another content type) is still read by the middleware.
      const ok = await send(`${srv.url}/p`, idempo.generateKey(), 'x', { 'content-type': 'application/octet-stream' });
      assert.equal(ok.status, 201);
      assert.equal(runs, 1);
      assert.ok(logs.some((l) => /body-unavailable/.test(l) && /keepRawBody/.test(l)), 'a log line names the fix');
    } finally {
      console.error = origError;
      await srv.close();
    }
  });

  test(`${name}: app.put(path, idempotency(), h) with the default methods is a ConfigError, never a silent no-op`, async () => {
    const app = express();
    const mw = idempo.idempotency({ store: new idempo.MemoryStore() });
    const warnings = [];
    mw.events.on('warning', (w) => warnings.push(w.message));
    let runs = 0;
    app.put('/orders/:id', mw, (_req, res) => res.status(200).json({ run: ++runs }));
    app.put('/both/:id', idempo.idempotency({ store: new idempo.MemoryStore(), methods: ['POST', 'PUT'] }), (_req, res) => res.json({ run: ++runs }));
    let caught;
    app.use((err, _req, res, _next) => {
      caught = err;
      res.status(500).json({ error: err.message });
    });
    const srv = await listen(app);
    try {
      const r = await send(`${srv.url}/orders/1`, idempo.generateKey(), {}, {}, 'PUT');
      assert.equal(r.status, 500);
      assert.equal(runs, 0, 'the handler does not run unprotected');
      assert.ok(caught instanceof idempo.ConfigError);
      assert.match(caught.message, /PUT \/orders\/:id/);
      assert.match(caught.message, /methods/);
      assert.equal(warnings.length, 1);
      await send(`${srv.url}/orders/1`, idempo.generateKey(), {}, {}, 'PUT');
      assert.equal(warnings.length, 1, 'warned once per route');
      const key = idempo.generateKey();
      await send(`${srv.url}/both/1`, key, {}, {}, 'PUT');
      const again = await send(`${srv.url}/both/1`, key, {}, {}, 'PUT');
      assert.equal(again.headers.get('idempotent-replayed'), 'true', 'PUT listed in methods is protected');
      const missing = await send(`${srv.url}/both/1`, undefined, {}, {}, 'PUT');
      assert.equal(missing.status, 400);
    } finally {
      await srv.close();
    }
  });

  // Cross-tenant matrix: two tenants, one key, one body: never a replay across tenants, whether
  // the principal comes from an earlier authentication middleware (req.user) or a cookie session.
  for (const auth of ['req.user', 'cookie session']) {
    for (const mount of ['route', 'app.use']) {
      test(`${name}: cross-tenant (${auth}, ${mount}): the same key and body from two tenants are two records`, async () => {
        const app = express();
        const sessions = new Map([
          ['s-alice', { tenant: 'alice' }],
          ['s-bob', { tenant: 'bob' }],
        ]);
        if (auth === 'req.user') {
          app.use((req, _res, next) => {
            const h = req.headers.authorization ?? '';
            if (h.startsWith('Bearer ')) req.user = { id: h.slice(7) };
            next();
          });
        } else {
          app.use((req, _res, next) => {
            const m = /(?:^|;\s*)sid=([^;]+)/.exec(req.headers.cookie ?? '');
            req.session = m ? sessions.get(m[1]) : undefined;
            next();
          });
        }
        const scope = auth === 'req.user' ? (req) => req.user?.id : (req) => req.session?.tenant;
        const mw = idempo.idempotency({ store: new idempo.MemoryStore(), scope });
        const runs = [];
        const handler = (req, res) => {
          const who = auth === 'req.user' ? req.user.id : req.session.tenant;
          runs.push(who);
          res.status(201).json({ tenant: who, n: runs.length });
        };
        if (mount === 'route') app.post('/transfers', mw, handler);
        else {
          app.use(mw);
          app.post('/transfers', handler);
        }
        const srv = await listen(app);
        try {
          const key = idempo.generateKey();
          const as = (t) => (auth === 'req.user' ? { authorization: `Bearer ${t}` } : { cookie: `sid=s-${t}` });
          const body = { amount: 10, to: 'x' };
          const a1 = await send(`${srv.url}/transfers`, key, body, as('alice'));
          const b1 = await send(`${srv.url}/transfers`, key, body, as('bob'));
          const a2 = await send(`${srv.url}/transfers`, key, body, as('alice'));
          const b2 = await send(`${srv.url}/transfers`, key, body, as('bob'));
          assert.deepEqual((await a1.json()).tenant, 'alice');
          const jb1 = await b1.json();
          assert.equal(jb1.tenant, 'bob', "bob never gets alice's stored response");
          assert.equal(b1.headers.get('idempotent-replayed'), null);
          assert.equal((await a2.json()).tenant, 'alice');
          assert.equal(a2.headers.get('idempotent-replayed'), 'true');
          assert.equal((await b2.json()).tenant, 'bob');
          assert.equal(b2.headers.get('idempotent-replayed'), 'true');
          assert.deepEqual(runs, ['alice', 'bob']);
          // No principal at all (no credentials): refused, never filed under a shared namespace.
          const anon = await send(`${srv.url}/transfers`, key, body);
          assert.equal(anon.status, 500);
          assert.equal((await anon.json()).type, 'urn:idempo:problem:scope-unresolved');
          assert.deepEqual(runs, ['alice', 'bob']);
        } finally {
          await srv.close();
        }
      });
    }
  }
}
