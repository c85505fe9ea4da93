// The actor runtime over the in-memory network with a fake clock: local and remote send/call, ordering,
// errors for vanished actors and dead peers, timeouts, cancellation, teardown, stray replies.
import assert from "node:assert/strict";
import { FakeClock } from "../../../node/clock.ts";
import { MemoryNetwork } from "../../../node/transport/memory.ts";
import {
  ActorFailedError,
  ActorNotFoundError,
  ActorSystem,
  CallTimeoutError,
  PeerUnreachableError,
} from "../../../node/actors/mod.ts";
import { encodeActorMessage } from "../../../node/wire/mod.ts";
import type { PeerAddr } from "../../../node/transport/transport.ts";

const enc = (s: string) => new TextEncoder().encode(s);
const dec = (b: Uint8Array) => new TextDecoder().decode(b);
/** Marks a promise as handled now (it is awaited later, after the fake network has run). */
const later = <T>(p: Promise<T>) => (p.catch(() => {}), p);

function cluster(n: number) {
  const clock = new FakeClock();
  const net = new MemoryNetwork(clock);
  const names = new Map<string, string>(); // a shared "registry"
  const addrs = new Map<string, PeerAddr>();
  const systems = Array.from({ length: n }, (_, i) => {
    const t = net.connect(`n${i}`);
    addrs.set(t.self.id, t.self);
    const sys = new ActorSystem({
      transport: t,
      clock,
      resolver: { resolve: (name) => names.get(name) },
      peers: { addressOf: (id) => addrs.get(id) },
      registrar: {
        register: (name) => names.set(name, t.self.id),
        unregister: (name) => names.delete(name),
      },
    });
    t.onMessage((from, msg, ch) => sys.receive(from, msg, ch));
    return sys;
  });
  /** Lets the fake network deliver: advance time and flush promise jobs, a few rounds. */
  const settle = async (ms = 10) => {
    for (let i = 0; i < 20; i++) {
      clock.advance(ms / 20);
      await new Promise((r) => setTimeout(r, 0));
    }
  };
  return { clock, net, systems, names, addrs, settle };
}

Deno.test("actors: call across nodes by name, with replies matched by request id", async () => {
  const { systems: [a, b], settle } = cluster(2);
  b.spawn("echo", { receive: (body, ctx) => enc(`${ctx.name} from ${ctx.from}: ${dec(body)}`) });
  const p1 = a.call("echo", enc("one"));
  const p2 = a.call("echo", enc("two"));
  await settle();
  assert.equal(dec(await p1), "echo from n0: one");
  assert.equal(dec(await p2), "echo from n0: two");
  // local calls skip the network
  assert.equal(dec(await b.call("echo", enc("self"))), "echo from n1: self");
});

Deno.test("actors: a mailbox handles one message at a time, in order", async () => {
  const { systems: [a, b], settle } = cluster(2);
  const seen: string[] = [];
  let active = 0, maxActive = 0;
  b.spawn("seq", {
    receive: async (body) => {
      maxActive = Math.max(maxActive, ++active);
      await new Promise((r) => setTimeout(r, 1));
      seen.push(dec(body));
      active--;
    },
  });
  for (let i = 0; i < 20; i++) await a.send("seq", enc(`${i}`));
  for (let i = 0; i < 10; i++) await settle();
  assert.deepEqual(seen, Array.from({ length: 20 }, (_, i) => `${i}`));
  assert.equal(maxActive, 1);
});

Deno.test("actors: unknown names, vanished actors and failing handlers give clear errors", async () => {
  const { systems: [a, b], names, settle } = cluster(2);
  await assert.rejects(() => a.call("nobody", enc("x")), ActorNotFoundError);
  await assert.rejects(() => a.send("nobody", enc("x")), ActorNotFoundError);
  b.spawn("boom", {
    receive: () => {
      throw new Error("kaput");
    },
  });
  const p = later(a.call("boom", enc("x")));
  await settle();
  await assert.rejects(() => p, (e) => e instanceof ActorFailedError && /kaput/.test(e.message));
  // the registry still points at b, but the actor is gone there (stale entry)
  const ref = b.spawn("ghost", { receive: () => enc("boo") });
  await ref.stop();
  names.set("ghost", "n1");
  const q = later(a.call("ghost", enc("x")));
  await settle();
  await assert.rejects(() => q, ActorNotFoundError);
});

Deno.test("actors: a dead peer fails calls instead of hanging (send false, or peerDown)", async () => {
  const { systems: [a, b], net, settle } = cluster(3);
  b.spawn("slow", { receive: () => new Promise(() => {}) });
  const pending = later(a.call("slow", enc("x"), { timeoutMs: 60_000 }));
  await settle();
  net.kill("n1");
  a.peerDown("n1");
  await assert.rejects(() => pending, PeerUnreachableError);
  const after = later(a.call("slow", enc("x")));
  await settle();
  await assert.rejects(() => after, PeerUnreachableError);
});

Deno.test("actors: timeouts and AbortSignal cancel the call and abort the remote handler", async () => {
  const { systems: [a, b], settle } = cluster(2);
  const aborted: string[] = [];
  b.spawn("hang", {
    receive: (body, ctx) =>
      new Promise((_, reject) => {
        ctx.signal.addEventListener("abort", () => {
          aborted.push(dec(body));
          reject(ctx.signal.reason);
        });
      }),
  });
  const t = later(a.call("hang", enc("timeout"), { timeoutMs: 100 }));
  await settle(200);
  await assert.rejects(() => t, CallTimeoutError);
  const ctl = new AbortController();
  const c = later(a.call("hang", enc("cancel"), { timeoutMs: 60_000, signal: ctl.signal }));
  await settle();
  ctl.abort(new Error("user gave up"));
  await assert.rejects(() => c, /user gave up/);
  await settle();
  assert.deepEqual(aborted.sort(), ["cancel", "timeout"]);
  assert.equal(a.droppedReplies, 0);
});

Deno.test("actors: stop() runs onStop once, fails queued calls, unregisters the name", async () => {
  const { systems: [a, b], names, settle } = cluster(2);
  let released = 0;
  let release!: () => void;
  const ref = b.spawn("worker", {
    receive: () => new Promise<void>((r) => (release = r)),
    onStop: () => void released++,
  });
  const first = a.call("worker", enc("1"));
  const second = later(a.call("worker", enc("2")));
  await settle();
  const stopping = ref.stop();
  assert.equal(names.has("worker"), false);
  release();
  await stopping;
  await settle();
  assert.equal(released, 1);
  await first; // the message in hand finishes
  await assert.rejects(() => second, ActorNotFoundError);
});

Deno.test("actors: replies to unknown request ids and malformed messages are dropped", async () => {
  const { systems: [a], net, settle } = cluster(2);
  const stranger = net.connect("x");
  await stranger.send(
    { id: "n0", addrs: [] },
    encodeActorMessage({ type: "reply", requestId: 999, body: enc("?") }),
  );
  await stranger.send({ id: "n0", addrs: [] }, new Uint8Array([0x41, 99, 1, 2]));
  await settle();
  assert.equal(a.droppedReplies, 1);
  assert.equal(a.malformed, 1);
});
