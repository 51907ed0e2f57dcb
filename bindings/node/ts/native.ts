// The napi-generated binding (native/index.js picks the .node file or the prebuilt platform
// package for this machine); native-load.ts turns a missing addon into an error naming the fix.
import './native-load';
// eslint-disable-next-line @typescript-eslint/no-require-imports
import native = require('../native/index.js');
export = native;
