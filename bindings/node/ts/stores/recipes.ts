import { recipes as nativeRecipes } from '../native';
import type { StoreRecord } from './types';

/** The store recipes of `spec/STORAGE.md`, read once from core (`idempo_core::recipes`). */
const RECIPES: Readonly<Record<string, string>> = Object.freeze({ ...nativeRecipes() });

/** The recipe called `name` (`postgres_claim`, `sqlite_get`, `redis_complete`, …). */
export function recipe(name: string): string {
  const text = RECIPES[name];
  if (text === undefined) throw new Error(`idempo: the native addon has no store recipe named ${name}`);
  return text;
}

/** A row of the `get` recipes (PostgreSQL returns its bigints as strings); all NULL when absent. */
export interface RecipeRow {
  fingerprint: string | null;
  state: number | string | null;
  token: Buffer | null;
  generation: number | string | null;
  lease_until: number | string | null;
  expires_at: number | string | null;
  response: Buffer | null;
  now_ms: number | string;
}

/** The record of a `get`-shaped row, or null when the row has none. */
export function recordFromRow(r: RecipeRow): StoreRecord | null {
  if (r.fingerprint === null) return null;
  return {
    fingerprint: r.fingerprint,
    state: Number(r.state) as 1 | 2 | 3,
    token: r.token as Buffer,
    generation: Number(r.generation),
    leaseUntil: r.lease_until === null ? null : Number(r.lease_until),
    expiresAt: Number(r.expires_at),
    response: r.response,
  };
}
