// Stop strings over streamed text: nothing that could start a stop string is passed on early, the text
// before the first stop string is exact however the text is cut into pieces.
import assert from "node:assert/strict";
import { StopMatcher } from "../../../node/serving/mod.ts";

/** Feeds `text` in pieces of `n` characters; the text passed on, and whether it stopped. */
function feed(stops: string[], text: string, n: number): { out: string; stopped: boolean; pieces: string[] } {
  const m = new StopMatcher(stops);
  const pieces: string[] = [];
  for (let i = 0; i < text.length && !m.stopped; i += n) pieces.push(m.push(text.slice(i, i + n)).text);
  if (!m.stopped) pieces.push(m.flush());
  return { out: pieces.join(""), stopped: m.stopped, pieces };
}

Deno.test("stop strings: the text before the first stop string, for every way of cutting it", () => {
  const text = "one two. three\n\nfour";
  for (let n = 1; n <= text.length; n++) {
    assert.deepEqual(
      [feed(["\n\n"], text, n).out, feed(["\n\n"], text, n).stopped],
      ["one two. three", true],
      `n=${n}`,
    );
    assert.equal(feed(["two.", "one"], text, n).out, "", `the earliest stop wins (n=${n})`);
    assert.equal(feed(["thr", "o."], text, n).out, "one tw", `n=${n}`);
    assert.deepEqual([feed(["five"], text, n).out, feed(["five"], text, n).stopped], [text, false], `n=${n}`);
  }
});

Deno.test("stop strings: a possible start is held back, then let go when it turns out not to be one", () => {
  const m = new StopMatcher(["</end>"]);
  assert.deepEqual(m.push("a</e"), { text: "a", stopped: false });
  assert.deepEqual(m.push("x"), { text: "</ex", stopped: false });
  assert.deepEqual(m.push("</en"), { text: "", stopped: false });
  assert.deepEqual(m.push("d>tail"), { text: "", stopped: true });
  assert.deepEqual(m.push("more"), { text: "", stopped: true });
  assert.equal(m.flush(), "");
  const held = new StopMatcher(["abc"]);
  held.push("xab");
  assert.equal(held.flush(), "ab", "at the end, what was held back is text");
  assert.deepEqual(new StopMatcher([]).push("anything"), { text: "anything", stopped: false });
});
