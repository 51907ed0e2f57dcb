// Express handler errors without `idempotencyErrorHandler()`: the plain middleware sees a thrown
// (Express 4 and 5), `next(err)`-ed or rejected (Express 5) handler error, and a 5xx rendered by an
// error handler follows the caching policy. Real Express 4 and 5 servers on 127.0.0.1.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo } from './helpers.mjs';

const require = createRequire(import.meta.url);
const flavours = { express5: require('express'), express4: require('express4') };

function listen(app) {
  return new Promise((resolve) => {
    const s = app.listen(0, '127.0.0.1', () =>
      resolve({
        url: `http://127.0.0.1:${s.address().port}`,
        close: () =>
          new Promise((r) => {
            s.closeAllConnections();
            s.close(r);
          }),
      }),
    );
  });
}

function post(url, key, body) {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify(body),
  });
}

const boom = (clean) => Object.assign(new Error('boom'), { noSideEffect: clean });

/** Handlers failing in each way a flavour supports: name -> (state) => Express handler. */
function failingHandlers(flavour) {
  const h = {
    'sync throw': (st) => (req, res) => {
      st.runs++;
      if (req.body.fail) throw boom(req.body.fail === 'clean');
      res.status(201).json({ run: st.runs });
    },
    'next(err)': (st) => (req, res, next) => {
      st.runs++;
      if (req.body.fail) return setTimeout(() => next(boom(req.body.fail === 'clean')), 5);
      res.status(201).json({ run: st.runs });
    },
  };
  if (flavour === 'express5') {
    h['async reject'] = (st) => async (req, res) => {
      st.runs++;
      await new Promise((r) => setTimeout(r, 5));
      if (req.body.fail) throw boom(req.body.fail === 'clean');
      res.status(201).json({ run: st.runs });
    };
  }
  return h;
}

for (const [flavour, express] of Object.entries(flavours)) {
  for (const [how, make] of Object.entries(failingHandlers(flavour))) {
    test(`${flavour} ${how}: no error handler mounted; clean errors release, others are outcome-unknown`, async () => {
      const st = { runs: 0 };
      const mw = idempo.idempotency({ store: new idempo.MemoryStore(), heartbeatMs: 0 });
      const outcomes = [];
      mw.events.on('outcome', (e) => outcomes.push(e.outcome));
      const app = express();
      app.set('env', 'test'); // no error log on stderr
      app.post('/p', mw, make(st));
      const srv = await listen(app);
      try {
        // Side-effect free failure: reported, key released, the retry runs again at once.
        let r = await post(`${srv.url}/p`, 'clean-key-0001', { fail: 'clean' });
        assert.equal(r.status, 500);
        await r.text();
        r = await post(`${srv.url}/p`, 'clean-key-0001', { fail: 'clean' });
        assert.equal(r.status, 500);
        assert.notEqual(r.headers.get('content-type'), 'application/problem+json');
        await r.text();
        assert.equal(st.runs, 2);

        // Failure that may have acted: terminal outcome-unknown, the handler does not run again.
        r = await post(`${srv.url}/p`, 'dirty-key-0001', { fail: 'dirty' });
        assert.equal(r.status, 500);
        await r.text();
        r = await post(`${srv.url}/p`, 'dirty-key-0001', { fail: 'dirty' });
        assert.equal(r.status, 500);
        assert.equal(r.headers.get('content-type'), 'application/problem+json');
        assert.equal((await r.json()).type, 'urn:idempo:problem:outcome-unknown');
        assert.equal(st.runs, 3);

        // The same route still stores and replays successes.
        r = await post(`${srv.url}/p`, 'ok-key-00001', {});
        assert.equal(r.status, 201);
        const first = await r.json();
        r = await post(`${srv.url}/p`, 'ok-key-00001', {});
        assert.equal(r.status, 201);
        assert.equal(r.headers.get('idempotent-replayed'), 'true');
        assert.deepEqual(await r.json(), first);
        assert.equal(st.runs, 4);
        assert.deepEqual(outcomes, ['handler_failed', 'handler_failed', 'handler_failed', 'outcome_unknown', 'stored', 'replayed']);
      } finally {
        await srv.close();
      }
    });
  }

  test(`${flavour}: app.use(idempotency()) without error handler reports thrown errors`, async () => {
    const st = { runs: 0 };
    const app = express();
    app.set('env', 'test');
    app.use(idempo.idempotency({ store: new idempo.MemoryStore(), heartbeatMs: 0 }));
    app.post('/p', (req) => {
      st.runs++;
      throw boom(true);
    });
    const srv = await listen(app);
    try {
      for (let i = 0; i < 3; i++) {
        const r = await post(`${srv.url}/p`, 'app-level-key1', {});
        assert.equal(r.status, 500);
        await r.text();
      }
      // Released each time (side-effect free), never stuck behind a lease.
      assert.equal(st.runs, 3);
    } finally {
      await srv.close();
    }
  });

  for (const storeServerErrors of [false, true]) {
    test(`${flavour}: a 5xx rendered by your error handler follows the caching policy (storeServerErrors ${storeServerErrors})`, async () => {
      const st = { runs: 0 };
      const app = express();
      app.use(idempo.idempotency({ store: new idempo.MemoryStore(), heartbeatMs: 0, storeServerErrors }));
      app.post('/p', () => {
        st.runs++;
        throw new Error('boom');
      });
      // Registered before the first request: it renders the error before idempo's tap is reached.
      app.use((err, _req, res, _next) => res.status(502).json({ error: err.message, run: st.runs }));
      const srv = await listen(app);
      try {
        const a = await post(`${srv.url}/p`, 'rendered-key1', {});
        assert.equal(a.status, 502);
        assert.deepEqual(await a.json(), { error: 'boom', run: 1 });
        const b = await post(`${srv.url}/p`, 'rendered-key1', {});
        assert.equal(b.status, 502);
        if (storeServerErrors) {
          assert.equal(b.headers.get('idempotent-replayed'), 'true');
          assert.deepEqual(await b.json(), { error: 'boom', run: 1 });
          assert.equal(st.runs, 1);
        } else {
          assert.equal(b.headers.get('idempotent-replayed'), null);
          assert.deepEqual(await b.json(), { error: 'boom', run: 2 });
          assert.equal(st.runs, 2);
        }
      } finally {
        await srv.close();
      }
    });
  }

  test(`${flavour}: an error thrown after the response was written keeps the stored response`, async () => {
    const st = { runs: 0 };
    const app = express();
    app.set('env', 'test');
    app.post('/p', idempo.idempotency({ store: new idempo.MemoryStore(), heartbeatMs: 0 }), (req, res) => {
      st.runs++;
      res.status(201).json({ run: st.runs });
      throw new Error('after the response');
    });
    const srv = await listen(app);
    try {
      const a = await post(`${srv.url}/p`, 'late-error-01', {});
      assert.equal(a.status, 201);
      assert.deepEqual(await a.json(), { run: 1 });
      const b = await post(`${srv.url}/p`, 'late-error-01', {});
      assert.equal(b.status, 201);
      assert.equal(b.headers.get('idempotent-replayed'), 'true');
      assert.deepEqual(await b.json(), { run: 1 });
      assert.equal(st.runs, 1);
    } finally {
      await srv.close();
    }
  });

  test(`${flavour}: the deprecated idempotencyErrorHandler() still works alongside the tap`, async () => {
    const st = { runs: 0 };
    const app = express();
    app.set('env', 'test');
    app.post('/p', idempo.idempotency({ store: new idempo.MemoryStore(), heartbeatMs: 0 }), () => {
      st.runs++;
      throw boom(false);
    });
    app.use(idempo.idempotencyErrorHandler());
    app.use((err, _req, res, _next) => res.status(500).json({ error: err.message }));
    const srv = await listen(app);
    try {
      const a = await post(`${srv.url}/p`, 'legacy-key-01', {});
      assert.equal(a.status, 500);
      assert.deepEqual(await a.json(), { error: 'boom' });
      const b = await post(`${srv.url}/p`, 'legacy-key-01', {});
      assert.equal((await b.json()).type, 'urn:idempo:problem:outcome-unknown');
      assert.equal(st.runs, 1);
    } finally {
      await srv.close();
    }
  });
}
