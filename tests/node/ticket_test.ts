import assert from "node:assert/strict";
import { encodeTicket, newSecret, parseTicket } from "../../node/ticket.ts";

const leader = { id: "ab".repeat(32), addrs: ["127.0.0.1:4000", "[::1]:4001"] };

Deno.test("ticket: round-trips secret, leader id and addresses", () => {
  const secret = newSecret();
  const text = encodeTicket({ secret, leader });
  assert.match(text, /^swactor1[a-z2-7]+$/);
  assert.deepEqual(parseTicket(`  ${text}\n`), { version: 1, secret, leader });
});

Deno.test("ticket: malformed tickets are TypeErrors naming the problem", () => {
  const text = encodeTicket({ secret: newSecret(), leader });
  const bad = (t: string, re: RegExp) =>
    assert.throws(() => parseTicket(t), (e) => e instanceof TypeError && re.test(e.message));
  bad("endpointabc", /must start with "swactor1"/);
  bad("swactor1abc!", /not a base32 character/);
  bad(text.slice(0, 30), /truncated/);
  const flipped = text.slice(0, 40) + (text[40] === "a" ? "b" : "a") + text.slice(41);
  bad(flipped, /checksum/);
});
