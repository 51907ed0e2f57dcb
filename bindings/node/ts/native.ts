// Loads the napi-generated binding (native/index.js picks the .node file for this platform).
// eslint-disable-next-line @typescript-eslint/no-require-imports
import native = require('../native/index.js');
export = native;
