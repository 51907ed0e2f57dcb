// RedisStore refuses to run unless maxmemory-policy is noeviction (an evicted claim is a double
// execution); the operator may opt out explicitly.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { idempo, missing, sharedRedis, closeShared, uniqueName } from './helpers.mjs';

after(closeShared);

test('RedisStore checks maxmemory-policy at start-up', { skip: missing('redis') ?? false }, async () => {
  const client = sharedRedis();
  const [, before] = await client.config('GET', 'maxmemory-policy');
  await client.config('SET', 'maxmemory-policy', 'volatile-lru');
  try {
    const store = new idempo.RedisStore({ client, prefix: `${uniqueName('p')}:` });
    await assert.rejects(store.claim(randomBytes(32), `v1:${'a'.repeat(64)}`, randomBytes(16), 1000, 2000), (e) => e instanceof idempo.ConfigError && /noeviction/.test(e.message));
    const optedOut = new idempo.RedisStore({ client, prefix: `${uniqueName('p')}:`, skipEvictionCheck: true });
    assert.equal((await optedOut.claim(randomBytes(32), `v1:${'a'.repeat(64)}`, randomBytes(16), 1000, 2000)).claimed, true);
  } finally {
    await client.config('SET', 'maxmemory-policy', before);
  }
  const ok = new idempo.RedisStore({ client, prefix: `${uniqueName('p')}:` });
  assert.equal((await ok.claim(randomBytes(32), `v1:${'a'.repeat(64)}`, randomBytes(16), 1000, 2000)).claimed, true);
});

test('a server or ACL user refusing CONFIG is a ConfigError naming assumeNoeviction', { skip: missing('redis') ?? false }, async () => {
  const { REDIS_URL } = await import('./helpers.mjs');
  const client = sharedRedis();
  const user = `idempo_noconfig_${process.pid}`;
  await client.call('ACL', 'SETUSER', user, 'on', '>pw', '~*', '&*', '+@all', '-config');
  const url = REDIS_URL.replace('redis://', `redis://${user}:pw@`);
  try {
    const store = new idempo.RedisStore({ url, prefix: `${uniqueName('p')}:` });
    await assert.rejects(
      store.get(randomBytes(32)),
      (e) => e instanceof idempo.ConfigError && e.code === 'CONFIG_INVALID' && /assumeNoeviction: true/.test(e.message) && /NOPERM/.test(e.message),
    );
    await store.close();
    const checkedByHand = new idempo.RedisStore({ url, prefix: `${uniqueName('p')}:`, assumeNoeviction: true });
    assert.equal((await checkedByHand.get(randomBytes(32))).record, null);
    await checkedByHand.close();
  } finally {
    await client.call('ACL', 'DELUSER', user);
  }
});
