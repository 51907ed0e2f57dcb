// Node side of `make bench-peers`: idempo (Rust core via the addon) vs `canonicalize` + crypto vs
// `json-canonicalize` + crypto vs raw crypto SHA-256, on the body files of a directory. Prints one
// JSON line per measurement (ns per operation, best of five interleaved rounds). Figures only.
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

// Best of five rounds per implementation, the rounds interleaved (round r runs every
// implementation once), so a load change on the machine skews all of them alike.
function timeAll(cases) {
  const best = {};
  for (const [impl, fn] of Object.entries(cases)) {
    try {
      fn();
      best[impl] = Infinity;
    } catch {
      best[impl] = null;
    }
  }
  for (let round = 0; round < 5; round++) {
    for (const [impl, fn] of Object.entries(cases)) {
      if (best[impl] === null) continue;
      let n = 0;
      const t0 = process.hrtime.bigint();
      let dt = 0n;
      do {
        fn();
        n++;
        dt = process.hrtime.bigint() - t0;
      } while (dt < BigInt(Math.round((budgetMs / 5) * 1e6)));
      best[impl] = Math.min(best[impl], Number(dt) / n);
    }
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
  for (const [impl, ns] of Object.entries(timeAll(cases))) {
    console.log(JSON.stringify({ lang: 'node', impl, body: name, ns }));
  }
}
