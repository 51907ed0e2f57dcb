import { recipes as nativeRecipes } from '../native';

/** The store recipes of `spec/STORAGE.md`, read once from core (`idempo_core::recipes`). */
const RECIPES: Readonly<Record<string, string>> = Object.freeze({ ...nativeRecipes() });

/** The recipe called `name` (`postgres_claim`, `sqlite_get`, `redis_complete`, …). */
export function recipe(name: string): string {
  const text = RECIPES[name];
  if (text === undefined) throw new Error(`idempo: the native addon has no store recipe named ${name}`);
  return text;
}
