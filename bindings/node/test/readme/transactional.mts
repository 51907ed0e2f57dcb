// The README's transactional example (see server.mts).
// ---- README ----
import express from 'express';
import pg from 'pg';
import { currentTransaction, idempotency, PostgresStore } from 'idempo';

const pool = new pg.Pool({ connectionString: process.env.DATABASE_URL });
const store = new PostgresStore({ pool, lockTimeoutMs: 2000 }); // or new SqliteStore({ filename })
const app = express();
app.post('/orders', idempotency({ store, transactional: true }), async (req, res) => {
  const tx = req.idempotency.tx as pg.PoolClient; // the pg client (SqliteStore: the better-sqlite3 db)
  await tx.query('INSERT INTO orders (id, amount) VALUES ($1, $2)', [req.body.id, req.body.amount]);
  await audit(req.body.id);
  res.status(201).json({ id: req.body.id }); // sent after COMMIT
});
// Anywhere below the handler: currentTransaction() returns the same connection (AsyncLocalStorage).
async function audit(id: string): Promise<void> {
  await currentTransaction<pg.PoolClient>().query('INSERT INTO audit (order_id) VALUES ($1)', [id]);
}
