#!/usr/bin/env node
// `make node-dist`: the npm tarballs, the napi-rs way, for the platform this machine builds.
//
//   pkg-dist/idempo-<suffix>-<version>.tgz  the prebuilt addon (`idempo.<suffix>.node`) with npm's
//                                           os/cpu/libc fields, e.g. idempo-linux-x64-gnu
//   pkg-dist/idempo-<version>.tgz           the JavaScript package: compiled TypeScript, the napi
//                                           loader, the vendored crate for a from-source build
//                                           (no target/), no runtime dependencies, the platform
//                                           package in optionalDependencies, no install script
//
// Run after `make node-build` (which builds the release addon into native/). Another platform's
// package is built the same way on that platform; the loader picks whichever is installed.
'use strict';
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const { platformSuffix, npmFields } = require('./platform.cjs');

const root = path.resolve(__dirname, '..');
const out = path.resolve(process.argv[2] ?? path.join(root, 'pkg-dist'));
const pkg = JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8'));
const suffix = platformSuffix();
const addon = path.join(root, 'native', `idempo.${suffix}.node`);
if (!fs.existsSync(addon)) {
  console.error(`idempo dist: ${path.relative(root, addon)} is missing: run \`make node-build\` first`);
  process.exit(1);
}

const npm = process.env.npm_execpath && fs.existsSync(process.env.npm_execpath) ? [process.execPath, process.env.npm_execpath] : ['npm'];
function npmPack(dir) {
  const args = [...npm.slice(1), 'pack', '--json', '--pack-destination', out];
  const json = execFileSync(npm[0], args, { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
  return path.join(out, JSON.parse(json)[0].filename);
}

fs.rmSync(out, { recursive: true, force: true });
fs.mkdirSync(out, { recursive: true });
const stage = fs.mkdtempSync(path.join(out, '.stage-'));

// 1. The platform package.
const platName = `idempo-${suffix}`;
const platDir = path.join(stage, platName);
fs.mkdirSync(platDir);
fs.copyFileSync(addon, path.join(platDir, `idempo.${suffix}.node`));
fs.writeFileSync(
  path.join(platDir, 'package.json'),
  JSON.stringify(
    {
      name: platName,
      version: pkg.version,
      description: `The idempo native addon (napi-rs) for ${suffix}; installed by idempo as an optional dependency.`,
      license: pkg.license,
      main: `idempo.${suffix}.node`,
      files: [`idempo.${suffix}.node`],
      ...npmFields(suffix),
      engines: pkg.engines,
    },
    null,
    2,
  ) + '\n',
);
fs.writeFileSync(path.join(platDir, 'README.md'), `# ${platName}\n\nThe prebuilt native addon of [idempo](https://www.npmjs.com/package/idempo) for ${suffix}. Install \`idempo\`, not this package.\n`);
const platTgz = npmPack(platDir);

// 2. The JavaScript package: `npm pack` (its prepack compiles the TypeScript and vendors the
// crate), then its package.json as published: no build scripts, no dev dependencies, the
// platform package as an optional dependency.
const rawTgz = npmPack(root);
const mainDir = path.join(stage, 'main');
fs.mkdirSync(mainDir);
execFileSync('tar', ['xzf', rawTgz, '-C', mainDir]);
fs.rmSync(rawTgz);
const pubDir = path.join(mainDir, 'package');
const pub = JSON.parse(fs.readFileSync(path.join(pubDir, 'package.json'), 'utf8'));
delete pub.scripts;
delete pub.devDependencies;
delete pub.dependencies;
delete pub.allowScripts;
pub.optionalDependencies = { [platName]: pkg.version };
fs.writeFileSync(path.join(pubDir, 'package.json'), JSON.stringify(pub, null, 2) + '\n');
for (const f of fs.readdirSync(path.join(pubDir, 'native'))) {
  if (f.endsWith('.node')) throw new Error(`idempo dist: native/${f} must not be in the JavaScript package`);
}
const mainTgz = npmPack(pubDir);
fs.rmSync(stage, { recursive: true, force: true });
console.log(path.relative(process.cwd(), mainTgz));
console.log(path.relative(process.cwd(), platTgz));
