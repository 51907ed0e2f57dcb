// Added time per request of idempo's Express middleware and Fastify plugin against the bare app,
// measured with wrk. Each variant is its own server process pinned to cpu 0 (taskset), wrk runs
// pinned to cpu 1 with one thread and 16 connections; variants interleave over rounds and the best
// round counts (the machine may be loaded: read the ratios). Figures only, nothing asserted.
//
//   node bench/e2e-overhead.mjs [seconds=4] [rounds=3] [variants=express,fastify] [stores=memory]
//
// Modes: `fresh` (a new key per request: admit, claim, handler, complete) and `replay` (one key:
// every request after the first is answered from the record; compared to the bare app's
// trivial handler). Added time per request = 1/rps(idempo) - 1/rps(bare), one server core; on a
// loaded machine the server's own CPU time per request (user + system, from /proc) is the steadier
// figure: added CPU per request = cpu(idempo) - cpu(bare).
import { spawn, execFileSync } from 'node:child_process';
import { writeFileSync, mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const seconds = Number(process.argv[2] ?? 4);
const rounds = Number(process.argv[3] ?? 3);
const frameworks = (process.argv[4] ?? 'express,fastify').split(',');
const stores = (process.argv[5] ?? 'memory').split(',');
const body = JSON.stringify({ amount: 1999, currency: 'eur', customer: 'cus_4QF8XkT1b2N9', description: 'Order #10045 for two items', metadata: { order_id: '10045', channel: 'web', campaign: 'spring' }, items: [{ sku: 'A-1', qty: 1 }, { sku: 'B-7', qty: 2 }] });
const dir = mkdtempSync(path.join(os.tmpdir(), 'idempo-wrk-'));
const lua = (fixed) => `
wrk.method = "POST"
wrk.body = ${JSON.stringify(body)}
wrk.headers["Content-Type"] = "application/json"
local prefix = "k" .. tostring(os.time()) .. tostring(math.random(1, 1000000000))
local n = 0
init = function(args) if args[1] then prefix = args[1] end end
request = function()
  n = n + 1
  wrk.headers["Idempotency-Key"] = ${fixed ? 'prefix' : 'prefix .. "-" .. n'}
  return wrk.format()
end
`;
writeFileSync(path.join(dir, 'fresh.lua'), lua(false));
writeFileSync(path.join(dir, 'replay.lua'), lua(true));

function startServer(framework, variant, port) {
  return new Promise((resolve, reject) => {
    const child = spawn('taskset', ['-c', '0', process.execPath, path.join(here, 'e2e-server.mjs'), framework, variant, String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
    child.stdout.on('data', (d) => { if (String(d).includes('ready')) resolve(child); });
    child.on('exit', (c) => reject(new Error(`${framework} ${variant} exited ${c}`)));
  });
}

/** CPU time (user + system) the process used so far, in µs (Linux /proc). */
function cpuUs(pid) {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return ((Number(f[11]) + Number(f[12])) * 1e6) / 100;
}

function wrk(port, mode, secs, tag, pid) {
  const cpu0 = cpuUs(pid);
  const out = execFileSync('taskset', ['-c', '1', 'wrk', '-t1', '-c16', `-d${secs}s`, '--latency', '-s', path.join(dir, `${mode}.lua`), `http://127.0.0.1:${port}/payments`, '--', `${tag}`], { encoding: 'utf8' });
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1]);
  const m = /\s99%\s+([\d.]+)(us|ms|s)/.exec(out);
  const p99 = m ? Number(m[1]) * (m[2] === 'us' ? 1e-3 : m[2] === 'ms' ? 1 : 1e3) : NaN;
  const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? 0);
  const requests = Number(/(\d+) requests in/.exec(out)?.[1]);
  return { rps, p99, non2xx, cpu: (cpuUs(pid) - cpu0) / requests };
}

const variants = [];
for (const f of frameworks) {
  variants.push([f, 'bare']);
  for (const s of stores) variants.push([f, s]);
}
let port = 18100 + Math.floor(Math.random() * 500);
const servers = new Map();
for (const [f, v] of variants) servers.set(`${f}/${v}`, { port, child: await startServer(f, v, port++) });
const best = new Map();
try {
  for (const [, s] of servers) wrk(s.port, 'fresh', 1, `warm${s.port}`, s.child.pid);
  for (let r = 0; r < rounds; r++) {
    for (const mode of ['fresh', 'replay']) {
      for (const [name, s] of servers) {
        const res = wrk(s.port, mode, seconds, `r${r}${mode}${s.port}`, s.child.pid);
        const k = `${name} ${mode}`;
        const b = best.get(k);
        // Best round per figure: the highest req/s, the lowest p99 and CPU time per request.
        if (!b) best.set(k, res);
        else best.set(k, { rps: Math.max(b.rps, res.rps), p99: Math.min(b.p99, res.p99), non2xx: Math.max(b.non2xx, res.non2xx), cpu: Math.min(b.cpu, res.cpu) });
      }
    }
  }
} finally {
  for (const [, s] of servers) s.child.kill();
}
console.log('variant                    mode    req/s     p99 ms  non-2xx  vs bare  added us/req  p99 vs bare  cpu us/req  added cpu us/req');
for (const [f, v] of variants) {
  for (const mode of ['fresh', 'replay']) {
    const r = best.get(`${f}/${v} ${mode}`);
    const bare = best.get(`${f}/bare ${mode}`);
    const added = 1e6 / r.rps - 1e6 / bare.rps;
    console.log(`${`${f}/${v}`.padEnd(26)} ${mode.padEnd(7)} ${r.rps.toFixed(0).padStart(7)} ${r.p99.toFixed(2).padStart(9)} ${String(r.non2xx).padStart(8)}  ${(r.rps / bare.rps).toFixed(2).padStart(6)}x ${added.toFixed(1).padStart(12)} ${(r.p99 / bare.p99).toFixed(2).padStart(11)}x ${r.cpu.toFixed(1).padStart(11)} ${(r.cpu - bare.cpu).toFixed(1).padStart(17)}`);
  }
}
