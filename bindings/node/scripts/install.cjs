#!/usr/bin/env node
// npm `install` hook: builds the native addon from source with cargo (through @napi-rs/cli) and,
// in the repository, compiles the TypeScript layer. Nothing is downloaded: the machine only needs
// Rust and the npm registry. Set IDEMPO_NODE_DEBUG=1 for a debug (faster to compile) addon.
'use strict';
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
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

// In the repository the crate builds inside the Cargo workspace; from a tarball it builds from
// the self-contained copy that scripts/prepack.cjs put in native-crate/.
const repo = path.resolve(root, '..', '..');
const inWorkspace =
  path.resolve(repo, 'bindings', 'node') === root &&
  fs.existsSync(path.join(repo, 'Cargo.toml')) &&
  fs.existsSync(path.join(repo, 'core', 'Cargo.toml'));

function resolvable(id) {
  try {
    require.resolve(id, { paths: [root] });
    return true;
  } catch {
    return false;
  }
}

// `npm install ./bindings/node` links this folder without installing its own dependencies:
// install them here with `npm ci` (which runs this script again, now able to build) and stop.
if (inWorkspace && !resolvable('@napi-rs/cli/package.json')) {
  const npmCli = process.env.npm_execpath;
  if (npmCli && fs.existsSync(npmCli)) run(process.execPath, [npmCli, 'ci', '--no-audit', '--no-fund']);
  else run('npm', ['ci', '--no-audit', '--no-fund']);
  process.exit(0);
}

const napiPkg = require.resolve('@napi-rs/cli/package.json', { paths: [root] });
const napi = path.join(path.dirname(napiPkg), require(napiPkg).bin.napi);
const debug = process.env.IDEMPO_NODE_DEBUG === '1';
const napiArgs = [napi, 'build', '--platform', '--output-dir', 'native', '--js', 'index.js', '--dts', 'index.d.ts'];
if (!inWorkspace) {
  const vendored = path.join(root, 'native-crate', 'idempo-node', 'Cargo.toml');
  if (!fs.existsSync(vendored)) {
    console.error('idempo: no Cargo workspace and no native-crate/ to build the addon from');
    process.exit(1);
  }
  napiArgs.push('--manifest-path', vendored, '--package-json-path', path.join(root, 'package.json'));
}
if (!debug) napiArgs.push('--release');
run(process.execPath, napiArgs);
// The TypeScript layer is compiled here in the repository; a tarball ships it compiled (prepack).
if (inWorkspace || !fs.existsSync(path.join(root, 'dist', 'index.js'))) {
  run(process.execPath, [require.resolve('typescript/bin/tsc', { paths: [root] }), '-p', 'tsconfig.json']);
  run(process.execPath, [path.join(__dirname, 'emit-esm.cjs')]);
}
