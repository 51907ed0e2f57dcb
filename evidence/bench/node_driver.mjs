// Node side of `make bench-peers`: idempo (Rust core via the addon) vs `canonicalize` + crypto vs
// `json-canonicalize` + crypto vs raw crypto SHA-256, on the body files of a directory. Prints one
// JSON line per measurement (ns per operation, best of five rounds). Figures only.
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, '..', '..', 'bindings', 'node', 'package.json'));
const idempo = require('./dist/index.js');
const canonicalizeNpm = require('canonicalize');
const { canonicalize: jsonCanonicalize } = require('json-canonicalize');

const dir = process.argv[2];
const budgetMs = Number(process.argv[3] || 500);

function timeIt(fn) {
  try {
    fn();
  } catch {
    return null;
  }
  let best = Infinity;
  for (let round = 0; round < 5; round++) {
    let n = 0;
    const t0 = process.hrtime.bigint();
    let dt = 0n;
    do {
      fn();
      n++;
      dt = process.hrtime.bigint() - t0;
    } while (dt < BigInt(Math.round((budgetMs / 5) * 1e6)));
    best = Math.min(best, Number(dt) / n);
  }
  return best;
}

const fp = new idempo.Fingerprinter();
for (const file of readdirSync(dir).filter((f) => f.endsWith('.json')).sort()) {
  const body = readFileSync(path.join(dir, file));
  const name = file.replace(/\.json$/, '');
  const cases = {
    'idempo fingerprint': () => fp.fingerprintJson('POST', '/payments', body),
    'canonicalize+sha256': () => createHash('sha256').update(canonicalizeNpm(JSON.parse(body.toString('utf8')))).digest(),
    'json-canonicalize+sha256': () => createHash('sha256').update(jsonCanonicalize(JSON.parse(body.toString('utf8')))).digest(),
    'raw sha256 (limit)': () => createHash('sha256').update(body).digest(),
  };
  for (const [impl, fn] of Object.entries(cases)) {
    console.log(JSON.stringify({ lang: 'node', impl, body: name, ns: timeIt(fn) }));
  }
}
