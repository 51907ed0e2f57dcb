/**
 * Heartbeat timers shared by every session of the process: one unref'd timer per heartbeat
 * interval, instead of a `setTimeout` and a `clearTimeout` per request. Each session's beat still
 * comes one full interval after it was scheduled (a lane's entries share one interval, so they
 * come due in the order they were added).
 */
import { performance } from 'node:perf_hooks';

/** Node's timers may fire up to a millisecond before `performance.now()` says the time is up. */
const SLACK_MS = 1;

class Lane {
  /** Beat -> when it is due (`performance.now()` ms); insertion order is due order. */
  readonly #due = new Map<() => void, number>();
  #timer: NodeJS.Timeout | undefined;

  constructor(readonly ms: number) {}

  add(beat: () => void): void {
    this.#due.set(beat, performance.now() + this.ms);
    if (this.#timer === undefined) this.#arm(this.ms);
  }

  /** The lane's timer stays armed when its last beat goes (it is unref'd, and finds nothing due
   * when it fires): a server with one request at a time would otherwise arm and clear a timer
   * per request. */
  remove(beat: () => void): void {
    this.#due.delete(beat);
  }

  #arm(delay: number): void {
    this.#timer = setTimeout(this.#fire, Math.max(0, delay));
    this.#timer.unref?.();
  }

  readonly #fire = (): void => {
    this.#timer = undefined;
    const now = performance.now();
    for (const [beat, at] of this.#due) {
      // A beat that schedules itself again lands at the end, due an interval later: stop there.
      if (at > now + SLACK_MS) break;
      this.#due.delete(beat);
      try {
        beat();
      } catch {
        // A beat reports its own failures; one must not stop the others.
      }
    }
    const head = this.#due.values().next();
    if (!head.done && this.#timer === undefined) this.#arm(head.value - performance.now());
  };
}

const lanes = new Map<number, Lane>();

/** Calls `beat` once, `ms` from now (unless {@link cancelBeat} comes first). */
export function scheduleBeat(ms: number, beat: () => void): void {
  let lane = lanes.get(ms);
  if (lane === undefined) {
    lane = new Lane(ms);
    lanes.set(ms, lane);
  }
  lane.add(beat);
}

/** Cancels a beat scheduled with {@link scheduleBeat} (nothing when it already ran). */
export function cancelBeat(ms: number, beat: () => void): void {
  lanes.get(ms)?.remove(beat);
}
