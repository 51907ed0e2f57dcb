// The README's store example (see server.mts).
// ---- README ----
import pg from 'pg';
import { Redis } from 'ioredis';
import { CachedStore, MemoryStore, PostgresStore, RedisStore, SqliteStore, type IdempotencyStore } from 'idempo';

const postgres = new PostgresStore({ pool: new pg.Pool({ connectionString: process.env.DATABASE_URL }) });
await postgres.createSchema(); // once, or apply POSTGRES_SCHEMA with your migrations
const redis = new RedisStore({ url: 'redis://127.0.0.1:6379' });
await redis.ready(); // refuses a server without maxmemory-policy noeviction
const stores: IdempotencyStore[] = [
  postgres,
  redis,
  new CachedStore({ authority: postgres, redis: new Redis('redis://127.0.0.1:6379') }),
  new SqliteStore({ filename: 'idempo.sqlite3' }),
  new MemoryStore(), // tests and one process only
];
const purged = await postgres.purgeExpired({ batch: 1000 });
console.log(stores.length, purged);
