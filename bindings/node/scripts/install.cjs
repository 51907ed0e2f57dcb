#!/usr/bin/env node
// Builds the native addon.
//
// In the repository (`make node-build`, `npm ci` in bindings/node): builds the addon from the
// Cargo workspace with @napi-rs/cli (a dev dependency; it also regenerates native/index.js and
// native/index.d.ts) and compiles the TypeScript layer. Set IDEMPO_NODE_DEBUG=1 for a debug addon.
//
// Installed as a dependency, the addon normally comes prebuilt in the platform package
// (`idempo-linux-x64-gnu`, ..., in optionalDependencies) and there is nothing to do. Without one,
// `node node_modules/idempo/scripts/install.cjs` builds it from the vendored crate (native-crate/)
// with cargo alone (Rust >= 1.88) into a temporary target directory, removed afterwards: nothing
// but the addon file stays in the package. Nothing is downloaded.
'use strict';
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { platformSuffix } = require('./platform.cjs');

const root = path.resolve(__dirname, '..');

function run(cmd, args, env = process.env) {
  const r = spawnSync(cmd, args, { cwd: root, stdio: 'inherit', env });
  if (r.error) {
    console.error(`idempo: could not start ${cmd}: ${r.error.message}`);
    process.exit(1);
  }
  if (r.status !== 0) {
    console.error(`idempo: ${cmd} ${args.join(' ')} failed with status ${r.status}`);
    process.exit(r.status ?? 1);
  }
}

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

function hasCargo() {
  const r = spawnSync('cargo', ['--version'], { stdio: 'ignore' });
  return !r.error && r.status === 0;
}

function buildInWorkspace() {
  // `npm install ./bindings/node` links this folder without installing its own dependencies:
  // install them here with `npm ci` (which runs this script again, now able to build) and stop.
  if (!resolvable('@napi-rs/cli/package.json')) {
    const npmCli = process.env.npm_execpath;
    if (npmCli && fs.existsSync(npmCli)) run(process.execPath, [npmCli, 'ci', '--no-audit', '--no-fund']);
    else run('npm', ['ci', '--no-audit', '--no-fund']);
    process.exit(0);
  }
  const napiPkg = require.resolve('@napi-rs/cli/package.json', { paths: [root] });
  const napi = path.join(path.dirname(napiPkg), require(napiPkg).bin.napi);
  const args = [napi, 'build', '--platform', '--output-dir', 'native', '--js', 'index.js', '--dts', 'index.d.ts'];
  if (process.env.IDEMPO_NODE_DEBUG !== '1') args.push('--release');
  run(process.execPath, args);
  run(process.execPath, [require.resolve('typescript/bin/tsc', { paths: [root] }), '-p', 'tsconfig.json']);
  run(process.execPath, [path.join(__dirname, 'emit-esm.cjs')]);
}

/** The addon loads (a prebuilt platform package, or an addon built earlier). */
function addonLoads() {
  try {
    require(path.join(root, 'native', 'index.js'));
    return true;
  } catch {
    return false;
  }
}

function buildFromSource() {
  const suffix = platformSuffix();
  const manifest = path.join(root, 'native-crate', 'Cargo.toml');
  if (!fs.existsSync(manifest)) {
    console.error('idempo: this package has no native-crate/ to build the addon from');
    process.exit(1);
  }
  const target = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-addon-'));
  const r = spawnSync('cargo', ['build', '--release', '--manifest-path', manifest, '-p', 'idempo-node'], {
    cwd: root,
    stdio: 'inherit',
    env: { ...process.env, CARGO_TARGET_DIR: target },
  });
  const lib = { darwin: 'libidempo_node.dylib', win32: 'idempo_node.dll' }[process.platform] ?? 'libidempo_node.so';
  const built = path.join(target, 'release', lib);
  const ok = !r.error && r.status === 0 && fs.existsSync(built);
  if (ok) fs.copyFileSync(built, path.join(root, 'native', `idempo.${suffix}.node`));
  // The target directory goes whatever happened: no target/ stays behind.
  fs.rmSync(target, { recursive: true, force: true });
  if (!ok) {
    console.error(`idempo: cargo build of the addon failed (${r.error ? r.error.message : `status ${r.status}`}); Rust >= 1.88 is needed`);
    process.exit(1);
  }
  console.error(`idempo: built native/idempo.${suffix}.node from source`);
}

if (inWorkspace) {
  buildInWorkspace();
} else if (process.argv.includes('--from-source')) {
  buildFromSource();
} else if (!addonLoads()) {
  if (hasCargo()) buildFromSource();
  else {
    console.error(
      `idempo: no prebuilt addon for ${platformSuffix()} (the optional package idempo-${platformSuffix()} is not installed) and no cargo on PATH to build one. ` +
        'Install with optional dependencies (not --omit=optional), or install Rust >= 1.88 and run `node node_modules/idempo/scripts/install.cjs --from-source`.',
    );
  }
}
