// Stop strings over streamed text: text is passed on as soon as it cannot be the start of a stop string;
// a tail that could still become one is held back until the next piece decides. The first stop string
// found ends the text before it (the stop string itself is not returned, as in OpenAI's API).

export class StopMatcher {
  #stops: string[];
  #held = "";
  #stopped = false;

  constructor(stops: readonly string[]) {
    this.#stops = stops.filter((s) => s.length > 0);
  }

  get stopped(): boolean {
    return this.#stopped;
  }

  /** Adds `text`; returns what can be passed on now, and whether a stop string was reached. */
  push(text: string): { text: string; stopped: boolean } {
    if (this.#stopped) return { text: "", stopped: true };
    const buf = this.#held + text;
    let cut = -1;
    for (const s of this.#stops) {
      const i = buf.indexOf(s);
      if (i >= 0 && (cut < 0 || i < cut)) cut = i;
    }
    if (cut >= 0) {
      this.#stopped = true;
      this.#held = "";
      return { text: buf.slice(0, cut), stopped: true };
    }
    const keep = this.#partialTail(buf);
    this.#held = buf.slice(buf.length - keep);
    return { text: buf.slice(0, buf.length - keep), stopped: false };
  }

  /** What is still held back, once the text has ended without a stop string. */
  flush(): string {
    const t = this.#stopped ? "" : this.#held;
    this.#held = "";
    return t;
  }

  /** Length of the longest tail of `buf` that is a proper prefix of some stop string. */
  #partialTail(buf: string): number {
    let best = 0;
    for (const s of this.#stops) {
      for (let n = Math.min(s.length - 1, buf.length); n > best; n--) {
        if (buf.endsWith(s.slice(0, n))) {
          best = n;
          break;
        }
      }
    }
    return best;
  }
}
