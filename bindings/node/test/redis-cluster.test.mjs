// Redis Cluster as a topology of its own (spec/STORAGE.md §5.3): the three-primary cluster of
// scripts/test-services.sh. The store scenarios and the concurrency storms run against the
// `redis-cluster` store kind (helpers.mjs); this file checks what only a cluster has.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { idempo, missing, clusterNodes, sharedCluster, closeShared, uniqueName } from './helpers.mjs';

const require = createRequire(import.meta.url);
const Redis = require('ioredis');
const skip = missing('redis-cluster') ?? false;
after(closeShared);

const FP = `v1:${'e'.repeat(64)}`;
const scope = (i) => idempo.scopeId('tenant', 'POST', '/payments', `cluster-key-${i}`);
const token = () => require('node:crypto').randomBytes(16);

async function withPolicy(node, policy, f) {
  const c = new Redis(node.port, node.host);
  await c.config('SET', 'maxmemory-policy', policy);
  try {
    await f();
  } finally {
    await c.config('SET', 'maxmemory-policy', 'noeviction');
    await c.quit();
  }
}

test('a single-node client pointed at a cluster node is refused', { skip }, async () => {
  const [first] = clusterNodes();
  const store = new idempo.RedisStore({ url: `redis://${first.host}:${first.port}` });
  try {
    await assert.rejects(store.ready(), (e) => e instanceof idempo.ConfigError && /cluster: true/.test(e.message));
    // A claim is refused too (the flow answers 503), never sent to a node that may MOVE it.
    await assert.rejects(store.claim(scope(1), FP, token(), 30_000, 60_000), idempo.ConfigError);
  } finally {
    await store.close();
  }
});

test('every primary is checked for noeviction', { skip }, async () => {
  const nodes = clusterNodes();
  const last = nodes[nodes.length - 1];
  await withPolicy(last, 'volatile-lru', async () => {
    const store = new idempo.RedisStore({ url: `redis://${nodes[0].host}:${nodes[0].port}`, cluster: true });
    try {
      await assert.rejects(store.ready(), (e) => e instanceof idempo.ConfigError && e.message.includes(`${last.host}:${last.port} has 'volatile-lru'`));
    } finally {
      await store.close();
    }
  });
});

test('a cluster client is accepted, its records spread over the primaries', { skip }, async () => {
  const client = sharedCluster();
  const prefix = `${uniqueName('spread')}:`;
  const store = new idempo.RedisStore({ client, prefix });
  assert.equal(store.cluster, true);
  await store.ready();
  for (let i = 0; i < 60; i++) {
    const r = await store.claim(scope(i), FP, token(), 30_000, 60_000);
    assert.equal(r.claimed, true);
  }
  const counts = [];
  for (const node of client.nodes('master')) counts.push((await node.keys(`${prefix}*`)).length);
  assert.equal(counts.reduce((a, b) => a + b, 0), 60);
  assert.ok(counts.filter((n) => n > 0).length >= 2, `records in one node only: ${counts}`);
});

test('client options that would move records are refused, whatever the client type', { skip }, () => {
  const single = new Redis({ lazyConnect: true, keyPrefix: 'app:' });
  assert.throws(() => new idempo.RedisStore({ client: single }), idempo.InvalidArgumentError);
  single.disconnect();
  const cluster = new Redis.Cluster(clusterNodes(), { lazyConnect: true, keyPrefix: 'app:' });
  assert.throws(() => new idempo.RedisStore({ client: cluster }), idempo.InvalidArgumentError);
  cluster.disconnect();
  const plain = new Redis({ lazyConnect: true });
  assert.throws(() => new idempo.RedisStore({ client: plain, cluster: true }), idempo.InvalidArgumentError);
  plain.disconnect();
});
