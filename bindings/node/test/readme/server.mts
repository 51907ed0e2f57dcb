// The README's Express server example (test/types.test.mjs checks it matches README.md and
// compiles under tsc --strict, skipLibCheck: false). Above the marker: what the example assumes.
declare function charge(body: unknown, downstreamKey: string): Promise<{ id: string }>;
// ---- README ----
import express from 'express';
import { idempotency, SqliteStore } from 'idempo';

// Your authentication's type for req.user (passport's @types add it the same way).
declare global {
  namespace Express {
    interface Request {
      user?: { id: string };
    }
  }
}

const store = new SqliteStore({ filename: 'idempo.sqlite3' }); // or PostgresStore, RedisStore, CachedStore
const app = express();
// req.user is set by your authentication middleware, mounted before this route.
app.post('/payments', idempotency({ store, scope: (req) => req.user?.id }), async (req, res) => {
  // req.body is parsed JSON; req.idempotency.downstreamKey is a stable key for side effects
  res.status(201).json(await charge(req.body, req.idempotency.downstreamKey));
});
