/**
 * Pending-key stores for the client's intents (`spec/KEYS.md` §3.6): per intent, the key sent with
 * every attempt, the fingerprint of the request it was minted for, and when. A record stays until
 * the server gives a definitive answer, so a retry, a second click or a restart sends the same key.
 *
 * A store's one rule: `getOrCreate` is atomic (read and insert in one step), so two callers or two
 * processes cannot mint two keys for one intent.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import type { PendingIntent } from '../core';

export type { PendingIntent } from '../core';

/** Where a client keeps its pending intents. `getOrCreate` must be atomic. */
export interface PendingKeyStore {
  /** The record of `intent`, or null. */
  get(intent: string): Promise<PendingIntent | null>;
  /** The record of `intent`; when there is none, stores `candidate` and returns it. Atomic. */
  getOrCreate(intent: string, candidate: PendingIntent): Promise<PendingIntent>;
  /** Forgets the record of `intent` (no error if there is none). */
  remove(intent: string): Promise<void>;
}

/** Records in a `Map` (they do not survive the process). */
export class MemoryPendingKeyStore implements PendingKeyStore {
  readonly #records = new Map<string, PendingIntent>();

  async get(intent: string): Promise<PendingIntent | null> {
    return this.#records.get(intent) ?? null;
  }

  async getOrCreate(intent: string, candidate: PendingIntent): Promise<PendingIntent> {
    const existing = this.#records.get(intent);
    if (existing) return existing;
    this.#records.set(intent, candidate);
    return candidate;
  }

  async remove(intent: string): Promise<void> {
    this.#records.delete(intent);
  }

  /** Every pending intent (e.g. to reconcile them at start-up). */
  async all(): Promise<Record<string, PendingIntent>> {
    return Object.fromEntries(this.#records);
  }
}

/** Options of {@link FilePendingKeyStore}. */
export interface FilePendingKeyStoreOptions {
  /** A lock file older than this (ms) was left by a crashed process and is broken (default 30000). */
  staleLockMs?: number;
  /** Give up waiting for the lock after this many ms (default 10000). */
  lockTimeoutMs?: number;
}

/** The file of a {@link FilePendingKeyStore} is not a pending-key file this version reads. */
export class PendingKeyFileError extends Error {
  readonly path: string;
  constructor(file: string, reason: string) {
    super(`cannot read pending keys from ${file}: ${reason}`);
    this.name = 'PendingKeyFileError';
    this.path = file;
  }
}

interface FileShape {
  version: number;
  pending: Record<string, PendingIntent>;
}

const VERSION = 1;

/**
 * Records in a small JSON file (`{"version":1,"pending":{"<intent>":{key,fingerprint,createdMs}}}`),
 * rewritten atomically (temp file + rename). Every operation holds `<file>.lock` (created
 * exclusively), so any number of processes sharing the file see one record per intent.
 */
export class FilePendingKeyStore implements PendingKeyStore {
  readonly path: string;
  readonly lockPath: string;
  readonly #staleMs: number;
  readonly #timeoutMs: number;

  constructor(file: string, options: FilePendingKeyStoreOptions = {}) {
    this.path = path.resolve(file);
    this.lockPath = `${this.path}.lock`;
    this.#staleMs = options.staleLockMs ?? 30_000;
    this.#timeoutMs = options.lockTimeoutMs ?? 10_000;
  }

  async get(intent: string): Promise<PendingIntent | null> {
    return this.#locked(async () => (await this.#load())[intent] ?? null);
  }

  async getOrCreate(intent: string, candidate: PendingIntent): Promise<PendingIntent> {
    return this.#locked(async () => {
      const records = await this.#load();
      const existing = records[intent];
      if (existing) return existing;
      records[intent] = { key: candidate.key, fingerprint: candidate.fingerprint, createdMs: candidate.createdMs };
      await this.#write(records);
      return candidate;
    });
  }

  async remove(intent: string): Promise<void> {
    await this.#locked(async () => {
      const records = await this.#load();
      if (!(intent in records)) return;
      delete records[intent];
      await this.#write(records);
    });
  }

  /** Every pending intent (e.g. to reconcile them at start-up). */
  async all(): Promise<Record<string, PendingIntent>> {
    return this.#locked(() => this.#load());
  }

  async #locked<T>(body: () => Promise<T>): Promise<T> {
    await fs.mkdir(path.dirname(this.path), { recursive: true });
    const deadline = Date.now() + this.#timeoutMs;
    for (let wait = 1; ; wait = Math.min(wait * 2, 25)) {
      try {
        const handle = await fs.open(this.lockPath, 'wx');
        await handle.close();
        break;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
        const stat = await fs.stat(this.lockPath).catch(() => null);
        if (stat && Date.now() - stat.mtimeMs > this.#staleMs) {
          await fs.rm(this.lockPath, { force: true });
          continue;
        }
        if (Date.now() > deadline) throw new Error(`timed out waiting for the lock ${this.lockPath}`);
        await new Promise((r) => setTimeout(r, wait));
      }
    }
    try {
      return await body();
    } finally {
      await fs.rm(this.lockPath, { force: true });
    }
  }

  async #load(): Promise<Record<string, PendingIntent>> {
    let text: string;
    try {
      text = await fs.readFile(this.path, 'utf8');
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === 'ENOENT') return {};
      throw e;
    }
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch (e) {
      throw new PendingKeyFileError(this.path, `not JSON (${(e as Error).message})`);
    }
    const file = doc as Partial<FileShape> | null;
    if (!file || typeof file !== 'object' || file.version !== VERSION || typeof file.pending !== 'object' || !file.pending) {
      throw new PendingKeyFileError(this.path, `not a version ${VERSION} pending-key file`);
    }
    for (const [intent, r] of Object.entries(file.pending)) {
      if (!r || typeof r.key !== 'string' || typeof r.fingerprint !== 'string' || typeof r.createdMs !== 'number') {
        throw new PendingKeyFileError(this.path, `malformed record for intent ${JSON.stringify(intent)}`);
      }
    }
    return { ...file.pending };
  }

  async #write(records: Record<string, PendingIntent>): Promise<void> {
    const tmp = `${this.path}.${process.pid}.${Date.now()}.tmp`;
    await fs.writeFile(tmp, JSON.stringify({ version: VERSION, pending: records }));
    await fs.rename(tmp, this.path);
  }
}
