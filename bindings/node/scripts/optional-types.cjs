#!/usr/bin/env node
// Marks the published declarations' references to optional peer packages (the store drivers, the
// frameworks; imports and module augmentations) `@ts-ignore`, so a project compiles them under `skipLibCheck: false` without pg,
// ioredis, better-sqlite3, express or fastify types installed: such a type is then `any`. With the
// package's types installed nothing changes. Run by emit-esm.cjs after every `tsc` build.
'use strict';
const fs = require('node:fs');
const path = require('node:path');

const OPTIONAL = ['pg', 'ioredis', 'better-sqlite3', 'express', 'express-serve-static-core', 'fastify', 'prom-client'];
const names = OPTIONAL.map((n) => n.replace(/[-/\\^$*+?.()|[\]{}]/g, '\\$&')).join('|');
// `from 'pg'`, `import('pg')`, `require('pg')`, and a module augmentation `declare module 'fastify'`
// (an error of its own when the module is absent).
const ref = new RegExp(`(?:from\\s+|import\\(\\s*|require\\(\\s*|declare\\s+module\\s+)['"](?:${names})(?:/[^'"]*)?['"]`);
const MARK = '// @ts-ignore optional peer dependency (idempo: scripts/optional-types.cjs)';

function walk(dir, out) {
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) walk(p, out);
    else if (/\.d\.(?:ts|mts|cts)$/.test(e.name)) out.push(p);
  }
  return out;
}

function mark(file) {
  const lines = fs.readFileSync(file, 'utf8').split('\n');
  const out = [];
  let changed = 0;
  for (const line of lines) {
    if (ref.test(line) && out[out.length - 1]?.trim() !== MARK) {
      out.push(line.slice(0, line.length - line.trimStart().length) + MARK);
      changed++;
    }
    out.push(line);
  }
  if (changed > 0) fs.writeFileSync(file, out.join('\n'));
  return changed;
}

if (require.main === module) {
  const dist = path.resolve(process.argv[2] ?? path.join(__dirname, '..', 'dist'));
  let n = 0;
  for (const f of walk(dist, [])) n += mark(f);
  if (process.env.IDEMPO_VERBOSE) console.error(`idempo: marked ${n} optional type references`);
}

module.exports = { mark, walk, OPTIONAL };
