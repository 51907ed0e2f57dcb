// Loads the napi-generated binding before anything uses it: native/index.js picks
// `native/idempo.<platform>.node` (built from source) or the prebuilt platform package
// (`idempo-linux-x64-gnu`, ...). When neither is there, the error says how to get one.
// (ts/native.ts then re-exports the cached module with its types.)
try {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  require('../native/index.js');
} catch (e) {
  // eslint-disable-next-line @typescript-eslint/no-require-imports
  const { platformSuffix } = require('../scripts/platform.cjs') as { platformSuffix: () => string };
  const suffix = platformSuffix();
  throw new Error(
    `idempo: the native addon for ${suffix} (Node ${process.versions.node}) is not installed. ` +
      `It comes prebuilt in the optional package idempo-${suffix}: install idempo with optional dependencies ` +
      '(not --omit=optional / --no-optional). Or build it from source (Rust >= 1.88, cargo on PATH): ' +
      '`node node_modules/idempo/scripts/install.cjs --from-source`.',
    { cause: e },
  );
}
export {};
