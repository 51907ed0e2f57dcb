// TypeScript (issue 14, finding 6): every `ts` example of the README is a file under
// test/readme/ (below its `// ---- README ----` line, exactly the README's text), and those files
// with the consumers compile under `tsc --strict` with `skipLibCheck: false` (test/tsconfig.json):
// `req.idempotency` on Express's Request, `scope: (req) => req.user?.id`, the stores' options.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { pkgRoot } from './helpers.mjs';

const require = createRequire(import.meta.url);
const readme = fs.readFileSync(path.join(pkgRoot, 'README.md'), 'utf8');

test('every ts example in the README is a checked file, and matches it', () => {
  const blocks = [...readme.matchAll(/```ts\n/g)].length;
  const checked = [...readme.matchAll(/<!-- checked: (test\/readme\/[\w.-]+) -->\n```ts\n([\s\S]*?)```\n/g)];
  assert.ok(checked.length >= 5, 'server, parsers, transactional, stores and client examples');
  assert.equal(checked.length, blocks, 'every ts block is checked');
  for (const [, file, text] of checked) {
    const src = fs.readFileSync(path.join(pkgRoot, file), 'utf8');
    const marker = '// ---- README ----\n';
    assert.ok(src.includes(marker), file);
    assert.equal(src.slice(src.indexOf(marker) + marker.length), text, `${file} differs from the README`);
  }
  const tsconfig = JSON.parse(fs.readFileSync(path.join(pkgRoot, 'test', 'tsconfig.json'), 'utf8'));
  assert.equal(tsconfig.compilerOptions.strict, true);
  assert.equal(tsconfig.compilerOptions.skipLibCheck, false);
  for (const [, file] of checked) assert.ok(tsconfig.files.includes(file.replace(/^test\//, '')), `${file} is compiled`);
});

test('the README examples and consumers compile: tsc --strict, skipLibCheck false', { timeout: 180_000 }, () => {
  const r = spawnSync(process.execPath, [require.resolve('typescript/bin/tsc'), '-p', path.join(pkgRoot, 'test', 'tsconfig.json'), '--noEmit'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stdout + r.stderr);
});
