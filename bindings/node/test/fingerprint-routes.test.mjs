// Fingerprinter.fingerprint keeps route-bound handles for JSON bodies: the answers must be those
// of the unbound call (forRoute, other methods, many routes past the cache's size) and bad
// arguments must fail as before.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { idempo } from './helpers.mjs';

const body = Buffer.from('{"b":[1,2.50,"x"],"a":{"d":null,"c":true}}');

test('fingerprint() with kept route handles equals forRoute and the header-configured path', () => {
  const f = new idempo.Fingerprinter();
  const plain = new idempo.Fingerprinter();
  // An explicit content type takes the general native path: the reference.
  const reference = (method, route) => plain.fingerprint({ method, route, body, contentType: 'application/json' });
  const withHeaders = new idempo.Fingerprinter({ headers: ['x-unused'] });
  for (let i = 0; i < 300; i++) {
    const method = i % 3 === 0 ? 'post' : 'POST';
    const route = `/r/${i}`;
    const got = f.fingerprint({ method, route, body });
    assert.equal(got, f.fingerprint({ method, route, body }), 'the kept handle answers the same');
    assert.equal(got, reference(method, route));
    assert.equal(got, plain.forRoute(method, route)(body));
    assert.notEqual(got, withHeaders.fingerprint({ method, route, body }), 'header names are framed');
  }
  // Past the cache's size (256 routes) the unbound path answers, the same way.
  assert.equal(f.fingerprint({ method: 'PUT', route: '/late', body }), reference('PUT', '/late'));
  assert.notEqual(f.fingerprint({ method: 'POST', route: '/r/1', body }), f.fingerprint({ method: 'POST', route: '/r/2', body }));
});

test('fingerprint() refuses bad arguments on the route path as before', () => {
  const f = new idempo.Fingerprinter();
  assert.throws(() => f.fingerprint({ method: 1, route: '/p', body }));
  assert.throws(() => f.fingerprint({ method: 'POST', route: '/p', body: 5 }));
  assert.throws(
    () => f.fingerprint({ method: 'POST', route: '/p', body: Buffer.from('{"a":1,"a":2}') }),
    (e) => e instanceof idempo.CanonicalizationError && e.code === 'CANONICALIZATION_ERROR',
  );
});
