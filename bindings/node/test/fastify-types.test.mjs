// The README's Fastify example (test/readme/fastify.mts, the same text as the README's block)
// compiles under `tsc --strict --noEmit` with `skipLibCheck: false` (issue 14, TypeScript):
// `request.idempotency` and `config.idempotency` come from the package's module augmentation,
// and `scope` receives a `FastifyRequest`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { here, pkgRoot } from './helpers.mjs';

const example = path.join(here, 'readme', 'fastify.mts');
const tsc = path.join(pkgRoot, 'node_modules', 'typescript', 'bin', 'tsc');
const flags = ['--strict', '--noEmit', '--skipLibCheck', 'false', '--target', 'ES2022', '--module', 'nodenext', '--moduleResolution', 'nodenext', '--types', 'node'];

function compile(file) {
  try {
    execFileSync(process.execPath, [tsc, ...flags, file], { cwd: pkgRoot, encoding: 'utf8', stdio: 'pipe' });
    return '';
  } catch (e) {
    return `${e.stdout}${e.stderr}`;
  }
}

test("the README's Fastify example is the checked file, verbatim", () => {
  const readme = fs.readFileSync(path.join(pkgRoot, 'README.md'), 'utf8');
  const m = readme.match(/<!-- checked: test\/readme\/fastify\.mts -->\n```ts\n([\s\S]*?)```/);
  assert.ok(m, 'README has the marked Fastify block');
  const src = fs.readFileSync(example, 'utf8');
  const marker = '// ---- README ----\n';
  assert.equal(m[1], src.slice(src.indexOf(marker) + marker.length));
});

test("the README's Fastify example compiles under tsc --strict with skipLibCheck false", () => {
  assert.equal(compile(example), '');
});

test('strict TypeScript rejects what the types rule out', () => {
  const dir = fs.mkdtempSync(path.join(pkgRoot, 'test', 'readme', 'tmp-'));
  try {
    const bad = path.join(dir, 'bad.mts');
    fs.writeFileSync(
      bad,
      [
        "import Fastify from 'fastify';",
        "import { idempotencyPlugin, MemoryStore } from 'idempo';",
        'const app = Fastify();',
        // scope gets a FastifyRequest: a property it does not have is an error.
        'await app.register(idempotencyPlugin, { store: new MemoryStore(), scope: (req) => req.nope });',
        // config.idempotency is a boolean.
        "app.post('/p', { config: { idempotency: 'yes' } }, async () => 'x');",
        // request.idempotency may be undefined (unprotected routes).
        "app.post('/q', async (req) => req.idempotency.downstreamKey);",
        '',
      ].join('\n'),
    );
    const out = compile(bad);
    assert.match(out, /bad\.mts\(4,.*Property 'nope' does not exist/);
    assert.match(out, /bad\.mts\(5,.*TS2322/);
    assert.match(out, /bad\.mts\(6,.*possibly 'undefined'/);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test('a project without fastify compiles against the declarations (skipLibCheck false)', () => {
  // Outside the package folder, so that `fastify` cannot resolve from a parent node_modules.
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-no-fastify-'));
  try {
    const nm = path.join(dir, 'node_modules');
    const pkg = path.join(nm, 'idempo');
    fs.mkdirSync(path.join(pkg, 'native'), { recursive: true });
    fs.cpSync(path.join(pkgRoot, 'dist'), path.join(pkg, 'dist'), { recursive: true });
    fs.copyFileSync(path.join(pkgRoot, 'package.json'), path.join(pkg, 'package.json'));
    for (const f of ['index.d.ts', 'index.js']) fs.copyFileSync(path.join(pkgRoot, 'native', f), path.join(pkg, 'native', f));
    // Everything the package's dev install has except fastify (store drivers: another check).
    for (const m of fs.readdirSync(path.join(pkgRoot, 'node_modules'))) {
      if (m === 'fastify' || m.startsWith('@fastify') || m === '.bin') continue;
      fs.symlinkSync(path.join(pkgRoot, 'node_modules', m), path.join(nm, m));
    }
    const consumer = path.join(dir, 'express-only.mts');
    fs.writeFileSync(consumer, "import { idempotency, MemoryStore } from 'idempo';\nexport const mw = idempotency({ store: new MemoryStore() });\n");
    assert.equal(compile(consumer), '');
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
