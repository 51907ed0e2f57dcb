// Cross-tenant matrix in Fastify (issue 14): authentication as an onRequest hook, as a preHandler
// hook registered after the plugin, as a route-level preHandler and as a decorator used by routes.
// Two tenants send the same key and the same body: each gets its own run, never the other's
// stored response; each one's retry replays its own.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo } from './helpers.mjs';

const require = createRequire(import.meta.url);
const Fastify = require('fastify');

const TOKENS = { 'token-a': { tenant: 'tenant-a' }, 'token-b': { tenant: 'tenant-b' } };

function authenticate(req, reply, done) {
  const user = TOKENS[String(req.headers.authorization ?? '').replace(/^Bearer /, '')];
  if (!user) return reply.code(401).send({ error: 'unauthorized' });
  req.user = user;
  done();
}

const styles = {
  'onRequest hook': async (app, routeOpts) => {
    app.addHook('onRequest', authenticate);
    return routeOpts;
  },
  'preHandler hook after the plugin': async (app, routeOpts) => {
    app.addHook('preHandler', authenticate);
    return routeOpts;
  },
  'route-level preHandler': async (_app, routeOpts) => ({ ...routeOpts, preHandler: authenticate }),
  'decorator (app.authenticate) on onRequest': async (app, routeOpts) => {
    app.decorate('authenticate', authenticate);
    return { ...routeOpts, onRequest: [app.authenticate] };
  },
  'decorator (app.authenticate) on preHandler, in a child plugin': async (app, routeOpts) => {
    app.decorate('authenticate', authenticate);
    return { ...routeOpts, preHandler: [app.authenticate], child: true };
  },
};

for (const [style, setup] of Object.entries(styles)) {
  test(`fastify: auth as ${style}: two tenants with the same key and body never share a response`, async () => {
    const app = Fastify({ forceCloseConnections: true });
    app.decorateRequest('user', null);
    await app.register(idempo.idempotencyPlugin, { store: new idempo.MemoryStore(), scope: (req) => req.user?.tenant, heartbeatMs: 0 });
    const opts = await setup(app, {});
    let runs = 0;
    const handler = async (req, reply) => reply.code(201).send({ tenant: req.user.tenant, run: ++runs });
    const { child, ...routeOpts } = opts;
    if (child) await app.register(async (c) => c.post('/pay', routeOpts, handler), { prefix: '/child' });
    else app.post('/pay', routeOpts, handler);
    await app.listen({ port: 0, host: '127.0.0.1' });
    const url = `http://127.0.0.1:${app.server.address().port}${child ? '/child' : ''}/pay`;
    const send = (token) =>
      fetch(url, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'idempotency-key': 'shared-key-0001' },
        body: '{"amount":10}',
      });
    try {
      const a = await send('token-a');
      assert.equal(a.status, 201);
      assert.deepEqual(await a.json(), { tenant: 'tenant-a', run: 1 });
      const b = await send('token-b');
      assert.equal(b.status, 201);
      assert.equal(b.headers.get('idempotent-replayed'), null);
      assert.deepEqual(await b.json(), { tenant: 'tenant-b', run: 2 });
      const a2 = await send('token-a');
      assert.equal(a2.headers.get('idempotent-replayed'), 'true');
      assert.deepEqual(await a2.json(), { tenant: 'tenant-a', run: 1 });
      const b2 = await send('token-b');
      assert.equal(b2.headers.get('idempotent-replayed'), 'true');
      assert.deepEqual(await b2.json(), { tenant: 'tenant-b', run: 2 });
      // Unauthenticated: the app's 401, nothing claimed.
      assert.equal((await send('nobody')).status, 401);
      assert.equal(runs, 2);
    } finally {
      await app.close();
    }
  });
}
