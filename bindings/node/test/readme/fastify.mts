// The README's Fastify example (test/types.test.mjs, fastify-types.test.mjs).
// ---- README ----
import Fastify from 'fastify';
import { idempotencyPlugin, SqliteStore } from 'idempo';

// Your code: authentication and the side effect.
declare function authenticate(header: string | undefined): Promise<{ id: string } | null>;
declare function charge(body: unknown, downstreamKey: string): Promise<{ id: string }>;
declare module 'fastify' {
  interface FastifyRequest {
    user: { id: string } | null;
  }
}

const app = Fastify();
app.decorateRequest('user', null);
// Authentication as a hook (onRequest, or preHandler: registered before or after the plugin).
app.addHook('preHandler', async (req, reply) => {
  req.user = await authenticate(req.headers.authorization);
  if (!req.user) return reply.code(401).send({ error: 'unauthorized' });
});

const store = new SqliteStore({ filename: 'idempo.sqlite3' }); // or PostgresStore, RedisStore, CachedStore
// Register the plugin before the routes. POST and PATCH are protected (the `methods` option).
await app.register(idempotencyPlugin, { store, scope: (req) => req.user?.id });

app.post('/payments', async (req, reply) => {
  // request.idempotency is set on every protected route: a stable key for downstream calls.
  const { downstreamKey } = req.idempotency!;
  return reply.code(201).send(await charge(req.body, downstreamKey));
});
app.idempotencyEvents.on('outcome', ({ outcome, route, status }) => console.log(outcome, route, status));
// Opt a route out. (`config: { idempotency: true }` on a method not in `methods`, e.g. PUT, throws at startup.)
app.post('/webhooks', { config: { idempotency: false } }, async () => ({ ok: true }));
