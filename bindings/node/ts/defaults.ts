import { optionDefaults } from './native';

/** A default of `spec/OPTIONS.md`: a number (ms or a count), a switch, a text or a list. */
export type OptionValue = number | boolean | string | readonly string[] | undefined;

function table(): Readonly<Record<string, Readonly<Record<string, OptionValue>>>> {
  const out: Record<string, Record<string, OptionValue>> = {};
  for (const e of optionDefaults()) {
    const owner = (out[e.owner] ??= {});
    owner[e.name] = e.number ?? e.flag ?? e.text ?? (e.list ? Object.freeze([...e.list]) : undefined);
  }
  return Object.freeze(out);
}

/**
 * Every host and store option's default, from core (`idempo_core::options`, `spec/OPTIONS.md`):
 * `OPTION_DEFAULTS.postgres_store.timeoutMs` is 2000 in Node as `timeout_ms` is in Python.
 */
export const OPTION_DEFAULTS = table();

/** The default of option `name` (camelCase) of `owner`; a missing entry is a packaging error. */
export function defaultOf<T extends OptionValue>(owner: string, name: string): T {
  const v = OPTION_DEFAULTS[owner]?.[name];
  if (v === undefined) throw new Error(`idempo: the native addon has no default for ${owner}.${name}`);
  return v as T;
}
