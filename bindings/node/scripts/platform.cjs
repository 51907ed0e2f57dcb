// The napi-rs platform suffix of this machine (`linux-x64-gnu`, `linux-arm64-musl`,
// `darwin-arm64`, `win32-x64-msvc`): the addon file is `idempo.<suffix>.node`, the prebuilt
// package `idempo-<suffix>`. Shared by install.cjs, dist.cjs and the messages of ts/native.ts.
'use strict';

function isMusl() {
  if (process.platform !== 'linux') return false;
  const report = typeof process.report?.getReport === 'function' ? process.report.getReport() : null;
  if (report?.header?.glibcVersionRuntime) return false;
  if (Array.isArray(report?.sharedObjects)) return report.sharedObjects.some((f) => f.includes('libc.musl-') || f.includes('ld-musl-'));
  return false;
}

function platformSuffix() {
  const { platform, arch } = process;
  if (platform === 'linux') return `linux-${arch}-${isMusl() ? 'musl' : 'gnu'}`;
  if (platform === 'win32') return `win32-${arch}-msvc`;
  return `${platform}-${arch}`;
}

/** npm's `os`, `cpu` and `libc` fields for the platform package of `suffix`. */
function npmFields(suffix) {
  const [os, cpu, abi] = suffix.split('-');
  const f = { os: [os], cpu: [cpu] };
  if (os === 'linux') f.libc = [abi === 'musl' ? 'musl' : 'glibc'];
  return f;
}

module.exports = { platformSuffix, npmFields };
