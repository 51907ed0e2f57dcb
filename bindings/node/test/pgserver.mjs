// A throwaway PostgreSQL server of a test file's own (scripts/test-services.sh), which fault tests
// may freeze (SIGSTOP: the kernel still accepts TCP, nothing answers) and restart (pg_ctl, fast).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { repoRoot } from './helpers.mjs';

const script = path.join(repoRoot, 'scripts', 'test-services.sh');

function pgBin(name) {
  const root = '/usr/lib/postgresql';
  const versions = fs.existsSync(root) ? fs.readdirSync(root).filter((v) => /^\d+$/.test(v)).sort((a, b) => Number(a) - Number(b)) : [];
  const v = versions[versions.length - 1];
  if (!v) throw new Error('PostgreSQL binaries not found under /usr/lib/postgresql (run scripts/setup.sh)');
  return path.join(root, v, 'bin', name);
}

/** Why an own server cannot run here, or null. */
export function ownServerUnavailable() {
  if (process.env.IDEMPO_SKIP_SERVICES === '1') return 'IDEMPO_SKIP_SERVICES=1';
  try {
    pgBin('pg_ctl');
  } catch (e) {
    if (process.env.CI) throw e;
    return e.message;
  }
  return null;
}

/** Starts a server; returns { dsn, freeze, thaw, restart, stop }. */
export function startOwnPg() {
  const work = fs.mkdtempSync(path.join(os.tmpdir(), 'idempo-node-ownpg-'));
  const out = execFileSync('bash', [script, 'start', work], { encoding: 'utf8', timeout: 120_000 });
  const env = Object.fromEntries(
    out
      .split('\n')
      .filter((l) => l.includes('='))
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  );
  const pgdataFile = path.join(work, 'pgdata');
  const data = fs.existsSync(pgdataFile) ? fs.readFileSync(pgdataFile, 'utf8').trim() : path.join(work, 'pg');
  const asPg = (cmd, args) =>
    process.getuid?.() === 0
      ? execFileSync('runuser', ['-u', 'postgres', '--', cmd, ...args], { stdio: 'pipe', timeout: 90_000 })
      : execFileSync(cmd, args, { stdio: 'pipe', timeout: 90_000 });
  const pids = () => {
    const postmaster = Number(fs.readFileSync(path.join(data, 'postmaster.pid'), 'utf8').split('\n')[0]);
    let children = '';
    try {
      children = execFileSync('pgrep', ['-P', String(postmaster)], { encoding: 'utf8' });
    } catch {
      children = '';
    }
    return [postmaster, ...children.split(/\s+/).filter(Boolean).map(Number)];
  };
  return {
    dsn: env.IDEMPO_TEST_PG_DSN,
    /** SIGSTOPs the postmaster and every backend; returns the pids for thaw. */
    freeze() {
      const all = pids();
      for (const pid of all) process.kill(pid, 'SIGSTOP');
      return all;
    },
    thaw(all) {
      for (const pid of [...all].reverse()) {
        try {
          process.kill(pid, 'SIGCONT');
        } catch {
          /* gone */
        }
      }
    },
    /** `pg_ctl restart -m fast`: every existing connection is terminated. */
    restart() {
      asPg(pgBin('pg_ctl'), ['-D', data, '-w', '-t', '60', '-m', 'fast', 'restart', '-l', path.join(data, 'server.log')]);
    },
    stop() {
      try {
        this.thaw(pids());
      } catch {
        /* not running */
      }
      execFileSync('bash', [script, 'stop', work], { stdio: 'pipe', timeout: 60_000 });
      fs.rmSync(work, { recursive: true, force: true });
    },
  };
}
