// Type-checked (never run) as an ES module consumer of the package: the published declarations
// must describe the API precisely enough for strict TypeScript code.
import idempoDefault, {
  canonicalize,
  fingerprint,
  Fingerprinter,
  parseKey,
  generateKey,
  scopeId,
  RetryPolicy,
  MemoryStore,
  SqliteStore,
  IdempoError,
  CanonicalizationError,
  idempotency,
  idempotencyPlugin,
  idempotentFetch,
  currentTransaction,
  PostgresStore,
  NoTransactionError,
  TransactionalUnsupportedError,
  supportsTransactions,
  type TransactionSession,
  type IdempotencyStore,
  type ClaimResult,
  type RetryDecision,
} from 'idempo';

const b: Buffer = canonicalize('{"a":1}');
const fp: string = fingerprint({ method: 'POST', route: '/p', body: b, headers: { 'x-a': '1' }, exclude: ['/t'] });
const f = new Fingerprinter({ headers: ['x-tenant'], hmacKey: 'secret' });
const fp2: string = f.fingerprintJson('POST', '/p', b);
const k: string = parseKey('"abcdefgh"', { strict: true }) + generateKey();
const s: Buffer = scopeId('', 'POST', '/p', k);
const d: RetryDecision = new RetryPolicy({ maxAttempts: 3 }).decide(1, 0, { kind: 'timeout' });
const store: IdempotencyStore = new MemoryStore();
const store2: IdempotencyStore = new SqliteStore({ filename: ':memory:' });
async function use(st: IdempotencyStore): Promise<number> {
  const r: ClaimResult = await st.claim(s, fp, Buffer.alloc(16), 30_000, 60_000);
  return r.claimed ? r.generation : 'record' in r ? r.record.generation : 0;
}
try {
  canonicalize('{');
} catch (e) {
  if (e instanceof CanonicalizationError) {
    const where: number = e.offset;
    const ptr: string | null = e.pointer;
    void where;
    void ptr;
  }
  if (e instanceof IdempoError) {
    const code: string = e.code;
    void code;
  }
}
const mw = idempotency({ store, route: () => '/p', scope: () => 'user' });
mw.events.on('outcome', (ev) => ev.outcome.length);
void idempotencyPlugin;
void idempoDefault.canonicalize;
const res: Promise<Response> = idempotentFetch('http://127.0.0.1:1/p', { method: 'POST', body: '{}' });
// Transactional mode: the option, the session API and the accessor are typed.
const sq = new SqliteStore({ filename: ':memory:', lockTimeoutMs: 2000 });
const txmw = idempotency({ store: sq, transactional: true });
const session: TransactionSession = sq.transaction();
const pgs = new PostgresStore({ connectionString: 'postgresql://localhost/x', timeoutMs: 2000, lockTimeoutMs: 1000, onPoolError: (e: Error) => e.message });
const canTx: boolean = supportsTransactions(store) && supportsTransactions(pgs);
function inHandler(): unknown {
  try {
    return currentTransaction<{ query: (sql: string) => Promise<unknown> }>().query('SELECT 1');
  } catch (e) {
    if (e instanceof NoTransactionError || e instanceof TransactionalUnsupportedError) return e.code;
    throw e;
  }
}
void [fp2, d, store2, use, res, txmw, session.committed, session.tx, canTx, inHandler];
