import assert from "node:assert/strict";
import {
  decodePacket,
  encodeMessage,
  fromBase64,
  isMembershipPacket,
  type Message,
  packPacket,
  toBase64,
} from "../../../node/membership/messages.ts";
import { seededRandom } from "../../../node/random.ts";

const meta = {
  name: "n1",
  version: "0.1.0",
  adapter: "llvmpipe",
  gpuMemoryBytes: 1 << 30,
  addrs: ["127.0.0.1:1"],
};
const samples: Message[] = [
  { t: "ping", seq: 1, target: "a" },
  { t: "pingReq", seq: 2, target: "b", addrs: ["127.0.0.1:5"], nack: true },
  { t: "ack", seq: 3 },
  { t: "nack", seq: 4 },
  { t: "alive", id: "a", inc: 5, addrs: [], meta },
  { t: "suspect", id: "a", inc: 5, from: "b" },
  { t: "dead", id: "a", inc: 6, from: "b" },
  { t: "leave", id: "a", inc: 7 },
  {
    t: "pushPull",
    join: true,
    reply: false,
    members: [{ id: "a", addrs: [], incarnation: 1, state: "suspect", meta }],
    user: { registry: toBase64(new Uint8Array([1, 2, 255])) },
  },
  { t: "user", ch: "registry", data: toBase64(new Uint8Array([0, 9])) },
];

Deno.test("every message round-trips through a packet", () => {
  const packet = packPacket(samples.map(encodeMessage));
  assert.ok(isMembershipPacket(packet));
  const d = decodePacket(packet);
  assert.equal(d.malformed, 0);
  assert.deepEqual(d.messages, samples);
  assert.deepEqual(fromBase64(toBase64(new Uint8Array([0, 1, 254, 255]))), new Uint8Array([0, 1, 254, 255]));
});

Deno.test("the decoder rejects wrong magic, wrong version, truncation and bad fields without throwing", () => {
  const good = packPacket([encodeMessage(samples[0])]);
  assert.equal(decodePacket(new Uint8Array([0x4d, 2, 0, 0, 0, 0])).malformed, 1);
  assert.equal(decodePacket(new Uint8Array([0, 1])).malformed, 1);
  assert.equal(decodePacket(good.subarray(0, good.length - 1)).messages.length, 0);
  const bad = (o: unknown) => decodePacket(packPacket([new TextEncoder().encode(JSON.stringify(o))]));
  for (
    const o of [
      { t: "ping", seq: -1, target: "a" },
      { t: "ping", seq: 1.5, target: "a" },
      { t: "ping", seq: 1, target: "" },
      { t: "alive", id: "a", inc: 1, addrs: [], meta: { ...meta, gpuMemoryBytes: "1" } },
      { t: "pushPull", join: true, reply: false, members: [{ id: "a" }], user: {} },
      { t: "suspect", id: "a", inc: 1 },
      { t: "nope" },
      [1, 2],
      null,
      "x".repeat(5000),
    ]
  ) {
    const d = bad(o);
    assert.equal(d.messages.length, 0, JSON.stringify(o).slice(0, 80));
    assert.equal(d.malformed, 1);
  }
  // One bad message inside a packet does not spoil the good ones.
  const mixed = packPacket([
    encodeMessage(samples[2]),
    new Uint8Array([0xff, 0xfe]),
    encodeMessage(samples[3]),
  ]);
  assert.deepEqual(decodePacket(mixed), { messages: [samples[2], samples[3]], malformed: 1 });
});

Deno.test("fuzz: random and mutated packets never throw", () => {
  const random = seededRandom(7);
  const seeds = samples.map((m) => packPacket([encodeMessage(m)]));
  for (let i = 0; i < 20_000; i++) {
    let bytes: Uint8Array;
    if (i % 2 === 0) {
      bytes = new Uint8Array(Math.floor(random() * 64));
      for (let j = 0; j < bytes.length; j++) bytes[j] = Math.floor(random() * 256);
      if (bytes.length > 1 && i % 4 === 0) bytes.set([0x4d, 1]);
    } else {
      bytes = seeds[i % seeds.length].slice();
      const flips = 1 + Math.floor(random() * 4);
      for (let f = 0; f < flips; f++) bytes[Math.floor(random() * bytes.length)] = Math.floor(random() * 256);
      if (random() < 0.3) bytes = bytes.subarray(0, Math.floor(random() * bytes.length));
    }
    const d = decodePacket(bytes);
    assert.ok(Array.isArray(d.messages) && d.malformed >= 0);
  }
});
