import assert from "node:assert/strict";
import { encodeTicket, newSecret, parseTicket } from "../../node/ticket.ts";

const leader = { id: "ab".repeat(32), addrs: ["127.0.0.1:4000", "[::1]:4001"] };

Deno.test("ticket: round-trips secret, leader id and addresses", () => {
  const secret = newSecret();
  const text = encodeTicket({ secret, leader });
  assert.match(text, /^swactor1[a-z2-7]+$/);
  assert.deepEqual(parseTicket(`  ${text}\n`), { version: 2, secret, leader });
});

Deno.test("ticket: carries the cluster's relay (n0 or a URL), and version 1 tickets still parse", () => {
  const secret = newSecret();
  for (const relay of ["n0", "https://relay.example.org./"]) {
    assert.deepEqual(parseTicket(encodeTicket({ secret, leader, relay })), {
      version: 2,
      secret,
      leader,
      relay,
    });
  }
  // A version 1 ticket (made by the previous build): no relay field.
  const v1 =
    "swactor1aeaacaqdaqcqmbyibefawdanbyhraeiscmkbkfqxdamrugy4dupb7k5lvov2xk5lvov2xk5lvov2xk5lvov2xk5lvov2xk5lvov2xk5laihdcmrxfyyc4mboge5dimbqgaffwor2gfotunbqgaysvv63f4";
  const t = parseTicket(v1);
  assert.equal(t.version, 1);
  assert.equal(t.relay, undefined);
  assert.deepEqual(t.leader, leader);
  assert.deepEqual(Array.from(t.secret), Array.from({ length: 32 }, (_, i) => i));
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
