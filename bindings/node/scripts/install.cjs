#!/usr/bin/env node
// npm `install` hook: builds the native addon from source with cargo (through @napi-rs/cli) and
// compiles the TypeScript layer. Nothing is downloaded: the machine only needs Rust and the npm
// registry. Set IDEMPO_NODE_DEBUG=1 for a debug (faster to compile) addon.
'use strict';
const { spawnSync } = require('node:child_process');
const path = require('node:path');

const root = path.resolve(__dirname, '..');

function run(cmd, args) {
  const r = spawnSync(cmd, args, { cwd: root, stdio: 'inherit', env: process.env });
  if (r.error) {
    console.error(`idempo: could not start ${cmd}: ${r.error.message}`);
    process.exit(1);
  }
  if (r.status !== 0) {
    console.error(`idempo: ${cmd} ${args.join(' ')} failed with status ${r.status}`);
    process.exit(r.status ?? 1);
  }
}

const napiPkg = require.resolve('@napi-rs/cli/package.json');
const napi = path.join(path.dirname(napiPkg), require(napiPkg).bin.napi);
const tsc = require.resolve('typescript/bin/tsc');
const debug = process.env.IDEMPO_NODE_DEBUG === '1';
const napiArgs = [napi, 'build', '--platform', '--output-dir', 'native', '--js', 'index.js', '--dts', 'index.d.ts'];
if (!debug) napiArgs.push('--release');
run(process.execPath, napiArgs);
run(process.execPath, [tsc, '-p', 'tsconfig.json']);
run(process.execPath, [path.join(__dirname, 'emit-esm.cjs')]);
