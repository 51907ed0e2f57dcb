// One option vocabulary (spec/OPTIONS.md): every host and store option the vector lists for Node
// is declared under its camelCase name, and its default is core's (read through the addon).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import os from 'node:os';
import { idempo, pkgRoot, vectorsDir } from './helpers.mjs';

const ROWS = JSON.parse(fs.readFileSync(path.join(vectorsDir, 'options', 'defaults.json'), 'utf8')).options;
const NODE_ROWS = ROWS.filter((r) => r.bindings.includes('node'));
const INTERFACES = {
  host: ['server/options.d.ts', 'IdempotencyOptions'],
  memory_store: ['stores/memory.d.ts', 'MemoryStoreOptions'],
  sqlite_store: ['stores/sqlite.d.ts', 'SqliteStoreOptions'],
  postgres_store: ['stores/postgres.d.ts', 'PostgresStoreOptions'],
  redis_store: ['stores/redis.d.ts', 'RedisStoreOptions'],
  cached_store: ['stores/cached.d.ts', 'CachedStoreOptions'],
  purge: ['stores/types.d.ts', 'PurgeOptions'],
};

/** The member names of `interface name` in a published declaration file. */
function members(file, name) {
  const text = fs.readFileSync(path.join(pkgRoot, 'dist', file), 'utf8');
  const start = text.search(new RegExp(`export interface ${name}(<[^>]*>)?\\s*(extends [^{]*)?\\{`));
  assert.ok(start >= 0, `${name} is declared in dist/${file}`);
  let depth = 0;
  let end = start;
  for (let i = text.indexOf('{', start); i < text.length; i++) {
    if (text[i] === '{') depth++;
    if (text[i] === '}' && --depth === 0) {
      end = i;
      break;
    }
  }
  const body = text.slice(text.indexOf('{', start) + 1, end).replace(/\/\*[\s\S]*?\*\//g, '');
  return new Set([...body.matchAll(/^\s*(?:readonly\s+)?([A-Za-z_][A-Za-z0-9_]*)\??:/gm)].map((m) => m[1]));
}

test('options: the addon gives core defaults, the vector', () => {
  for (const row of ROWS) {
    const got = idempo.OPTION_DEFAULTS[row.owner]?.[row.camel];
    assert.deepEqual(got === undefined ? null : Array.isArray(got) ? [...got] : got, row.default, `${row.owner}.${row.name}`);
  }
});

for (const row of NODE_ROWS) {
  test(`options: ${row.owner}.${row.camel} is declared under that name`, () => {
    const [file, name] = INTERFACES[row.owner];
    assert.ok(members(file, name).has(row.camel), `${name} has no \`${row.camel}\` (spec/OPTIONS.md)`);
  });
}

test('options: every duration option of a store is in milliseconds', () => {
  for (const [owner, [file, name]] of Object.entries(INTERFACES)) {
    for (const m of members(file, name)) {
      if (/timeout|ttl|grace/i.test(m)) assert.ok(m.endsWith('Ms'), `${owner}: ${name}.${m} is not in milliseconds`);
    }
  }
});

test('options: the stores take their defaults from core', async () => {
  const d = (owner, name) => ROWS.find((r) => r.owner === owner && r.camel === name).default;
  const pg = new idempo.PostgresStore({ connectionString: 'postgresql://127.0.0.1:1/none' });
  try {
    for (const name of ['timeoutMs', 'lockTimeoutMs', 'idleInTransactionTimeoutMs', 'purgeTimeoutMs']) {
      assert.equal(pg[name], d('postgres_store', name), name);
    }
  } finally {
    await pg.close();
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-options-'));
  const lite = new idempo.SqliteStore({ filename: path.join(dir, 'db.sqlite3') });
  try {
    assert.equal(lite.busyTimeoutMs, d('sqlite_store', 'busyTimeoutMs'));
    assert.equal(lite.lockTimeoutMs, d('sqlite_store', 'lockTimeoutMs'));
  } finally {
    await lite.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('options: a retention no longer than the lease is refused (spec/PROTOCOL.md §6)', () => {
  const store = new idempo.MemoryStore();
  assert.throws(() => idempo.idempotency({ store, leaseMs: 30_000, ttlMs: 30_000 }), (e) => {
    assert.ok(e instanceof idempo.ConfigError);
    assert.match(e.message, /ttl_ms \(30000 ms\) must be longer than lease_ms/);
    return true;
  });
  assert.doesNotThrow(() => idempo.idempotency({ store, leaseMs: 5_000, ttlMs: 5_001 }));
});
