// Scenario 6 (purge) for the Node package: loops `store.purgeExpired({ batch })` until a batch
// comes back short, printing one JSON line per batch ({ ms, inProgress, completed,
// outcomeUnknown }) so run.py can time the batches while it keeps live requests going.
//
//   node evidence/reliability/node_purge.cjs sqlite|postgres <file or DSN> <batch>
'use strict';
const path = require('node:path');
const { createRequire } = require('node:module');

const req = createRequire(path.join(path.resolve(__dirname, '..', '..', 'bindings', 'node'), 'package.json'));
const idempo = req('./dist/index.js');

async function main() {
  const [kind, url, batchArg] = process.argv.slice(2);
  const batch = Number(batchArg);
  if (!Number.isInteger(batch) || batch < 1) throw new Error(`batch must be a positive integer, got ${batchArg}`);
  let store;
  if (kind === 'sqlite') store = new idempo.SqliteStore({ filename: url, busyTimeoutMs: 5000 });
  else if (kind === 'postgres') store = new idempo.PostgresStore({ connectionString: url });
  else throw new Error(`unknown store ${kind} (sqlite, postgres)`);
  try {
    for (;;) {
      const t0 = process.hrtime.bigint();
      const c = await store.purgeExpired({ batch });
      const ms = Number(process.hrtime.bigint() - t0) / 1e6;
      process.stdout.write(`${JSON.stringify({ ms, ...c })}\n`);
      if (c.inProgress + c.completed + c.outcomeUnknown < batch) break;
    }
  } finally {
    await store.close();
  }
}

main().catch((e) => {
  process.stderr.write(`${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
