/**
 * The transaction of a handler running in transactional mode, reachable without threading the
 * request through: `currentTransaction()` (an `AsyncLocalStorage` set around the handler).
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { NoTransactionError } from '../errors';

/** What the storage holds for one request; `tx` is cleared once the transaction ended. */
export interface TxHolder {
  tx: unknown;
}

/** The per-request storage the Express middleware and the Fastify plugin set. */
export const txStorage = new AsyncLocalStorage<TxHolder>();

/**
 * The open transaction of the running transactional handler: a `pg` client (`PostgresStore`) or
 * the better-sqlite3 database (`SqliteStore`). Write through it and never commit or roll it back:
 * idempo commits after storing the response, or rolls back. Throws `NoTransactionError` outside a
 * transactional handler or after its transaction ended.
 */
export function currentTransaction<T = unknown>(): T {
  const h = txStorage.getStore();
  if (h === undefined || h.tx === null || h.tx === undefined) throw new NoTransactionError();
  return h.tx as T;
}
