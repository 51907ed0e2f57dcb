/** Response header fields as the flow takes them. */
import type { OutgoingHttpHeaders } from 'node:http';

/** Header fields (a `getHeaders()` object) as `[name, value]` pairs, names lowercased, one pair
 * per value. */
export function headerPairs(all: OutgoingHttpHeaders | Record<string, unknown>): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  for (const n in all) {
    const v = (all as Record<string, unknown>)[n];
    if (v === undefined) continue;
    if (Array.isArray(v)) for (const one of v) out.push([n.toLowerCase(), String(one)]);
    else out.push([n.toLowerCase(), String(v)]);
  }
  return out;
}
