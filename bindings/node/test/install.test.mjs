// Installing the package as a user does (issue 14, finding 9): the tarballs `make node-dist` builds
// (scripts/dist.cjs) go into a fresh folder with npm, offline, with no cargo on PATH. The addon
// comes from the platform package, nothing compiles, no target/ is installed, no dependency's
// engines exclude Node 20, and a request runs through Express. The declarations compile under
// `tsc --strict` with `skipLibCheck: false` where none of the optional drivers' types exist.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pkgRoot } from './helpers.mjs';

const require = createRequire(import.meta.url);
const semver = require('semver');
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-install-'));
const dist = path.join(work, 'dist');
const pkg = JSON.parse(fs.readFileSync(path.join(pkgRoot, 'package.json'), 'utf8'));
const { platformSuffix } = require('../scripts/platform.cjs');
const platName = `idempo-${platformSuffix()}`;
let tarballs;

/** PATH without any directory holding cargo or rustc. */
const noCargoPath = (process.env.PATH ?? '')
  .split(path.delimiter)
  .filter((d) => d && !fs.existsSync(path.join(d, 'cargo')) && !fs.existsSync(path.join(d, 'rustc')))
  .join(path.delimiter);
const env = { ...process.env, PATH: noCargoPath, npm_config_update_notifier: 'false' };
delete env.npm_execpath;
delete env.CARGO_HOME;
const npmCli = path.join(path.dirname(process.execPath), '..', 'lib', 'node_modules', 'npm', 'bin', 'npm-cli.js');

function npm(cwd, args) {
  const r = spawnSync(process.execPath, [npmCli, ...args], { cwd, env, encoding: 'utf8', timeout: 180_000 });
  return { status: r.status, out: `${r.stdout}\n${r.stderr}` };
}

function freshProject(name) {
  const dir = path.join(work, name);
  fs.mkdirSync(dir);
  fs.writeFileSync(path.join(dir, 'package.json'), JSON.stringify({ name, version: '1.0.0', private: true }));
  return dir;
}

before(() => {
  assert.equal(spawnSync('cargo', ['--version'], { env }).error?.code, 'ENOENT', 'cargo must not be on the test PATH');
  const out = execFileSync(process.execPath, [path.join(pkgRoot, 'scripts', 'dist.cjs'), dist], { cwd: pkgRoot, encoding: 'utf8', timeout: 300_000 });
  tarballs = out.trim().split('\n').map((l) => path.resolve(pkgRoot, l.trim()));
});
after(() => fs.rmSync(work, { recursive: true, force: true }));

test('the packed tarballs install offline without cargo and serve a request through Express', { timeout: 300_000 }, async () => {
  const main = tarballs.find((t) => path.basename(t) === `idempo-${pkg.version}.tgz`);
  const plat = tarballs.find((t) => path.basename(t) === `${platName}-${pkg.version}.tgz`);
  assert.ok(main && plat, `both tarballs (${tarballs})`);
  const listing = execFileSync('tar', ['tzf', main], { encoding: 'utf8' });
  assert.doesNotMatch(listing, /(^|\/)target\//m, 'no cargo target/ in the package');
  assert.doesNotMatch(listing, /\.node$/m, 'the addon is in the platform package only');

  const app = freshProject('app');
  const r = npm(app, ['install', '--offline', '--no-audit', '--no-fund', main, plat]);
  assert.equal(r.status, 0, r.out);
  assert.doesNotMatch(r.out, /EBADENGINE/);
  assert.doesNotMatch(r.out, /install-scripts|allowScripts/, 'npm 11: no install script to approve');
  assert.doesNotMatch(r.out, /cargo|napi build|Compiling/i, 'nothing compiles');
  const nm = path.join(app, 'node_modules');
  assert.deepEqual(fs.readdirSync(nm).filter((n) => !n.startsWith('.')).sort(), ['idempo', platName].sort(), 'no runtime dependencies (@napi-rs/cli is a dev dependency)');
  assert.equal(fs.existsSync(path.join(nm, 'idempo', 'target')), false);
  const installed = JSON.parse(fs.readFileSync(path.join(nm, 'idempo', 'package.json'), 'utf8'));
  assert.equal(installed.scripts, undefined, 'no install script: nothing for allowScripts to approve');
  assert.deepEqual(installed.optionalDependencies, { [platName]: pkg.version });
  // Every installed package accepts every Node version idempo declares (>= 20): no EBADENGINE.
  for (const name of fs.readdirSync(nm).filter((n) => !n.startsWith('.'))) {
    const p = JSON.parse(fs.readFileSync(path.join(nm, name, 'package.json'), 'utf8'));
    if (p.engines?.node) assert.ok(semver.satisfies('20.0.0', p.engines.node), `${name} engines ${p.engines.node}`);
  }

  fs.writeFileSync(
    path.join(app, 'server.cjs'),
    `const express = require(${JSON.stringify(require.resolve('express'))});
const idempo = require('idempo');
const app = express();
let runs = 0;
app.post('/pay', idempo.idempotency({ store: new idempo.MemoryStore() }), (req, res) => res.status(201).json({ run: ++runs, amount: req.body.amount }));
const s = app.listen(0, '127.0.0.1', async () => {
  const url = 'http://127.0.0.1:' + s.address().port + '/pay';
  const h = { 'content-type': 'application/json', 'idempotency-key': idempo.generateKey() };
  const a = await fetch(url, { method: 'POST', headers: h, body: '{"amount":5}' });
  const b = await fetch(url, { method: 'POST', headers: h, body: '{"amount":5}' });
  console.log(JSON.stringify({ a: a.status, b: b.status, replayed: b.headers.get('idempotent-replayed'), body: await b.json(), addon: require.resolve(${JSON.stringify(platName)}) }));
  s.close();
});
`,
  );
  const run = spawnSync(process.execPath, ['server.cjs'], { cwd: app, env, encoding: 'utf8', timeout: 60_000 });
  assert.equal(run.status, 0, run.stderr);
  const got = JSON.parse(run.stdout.trim());
  assert.deepEqual([got.a, got.b, got.replayed, got.body], [201, 201, 'true', { run: 1, amount: 5 }]);
  assert.ok(got.addon.startsWith(path.join(nm, platName)), got.addon);

  // The declarations need none of the optional peers' types (pg, ioredis, better-sqlite3,
  // express, fastify, prom-client): strict, skipLibCheck false, only @types/node present.
  fs.mkdirSync(path.join(nm, '@types'));
  fs.symlinkSync(path.join(pkgRoot, 'node_modules', '@types', 'node'), path.join(nm, '@types', 'node'));
  fs.writeFileSync(
    path.join(app, 'use.mts'),
    `import { idempotency, MemoryStore, SqliteStore, PostgresStore, RedisStore, CachedStore, idempotentFetch, type IdempotencyStore } from 'idempo';
const store: IdempotencyStore = new MemoryStore();
const mw = idempotency({ store, scope: (req) => String(req.headers['x-tenant']) });
mw.events.on('outcome', (e) => e.status);
const kinds: unknown[] = [SqliteStore, PostgresStore, RedisStore, CachedStore];
const res: Promise<Response> = idempotentFetch('http://127.0.0.1:1/p', { method: 'POST', body: '{}' });
void [kinds, res];
`,
  );
  fs.writeFileSync(
    path.join(app, 'tsconfig.json'),
    JSON.stringify({ compilerOptions: { strict: true, noEmit: true, skipLibCheck: false, module: 'nodenext', moduleResolution: 'nodenext', target: 'ES2022', types: ['node'] }, files: ['use.mts'] }),
  );
  for (const absent of ['pg', 'ioredis', 'better-sqlite3', 'express', '@types/express', 'fastify', 'prom-client']) {
    assert.equal(fs.existsSync(path.join(nm, absent)), false, absent);
  }
  const tsc = spawnSync(process.execPath, [require.resolve('typescript/bin/tsc'), '-p', 'tsconfig.json'], { cwd: app, env, encoding: 'utf8', timeout: 120_000 });
  assert.equal(tsc.status, 0, tsc.stdout + tsc.stderr);
});

test('without the platform package the loader names the fix', { timeout: 120_000 }, () => {
  const main = tarballs.find((t) => path.basename(t) === `idempo-${pkg.version}.tgz`);
  const app = freshProject('bare');
  const r = npm(app, ['install', '--offline', '--no-audit', '--no-fund', '--omit=optional', main]);
  assert.equal(r.status, 0, r.out);
  const run = spawnSync(process.execPath, ['-e', "require('idempo')"], { cwd: app, env, encoding: 'utf8' });
  assert.notEqual(run.status, 0);
  assert.match(run.stderr, new RegExp(`native addon for ${platformSuffix()}`));
  assert.match(run.stderr, new RegExp(`optional package ${platName}`));
  assert.match(run.stderr, /install\.cjs --from-source/);
});
