// The connection handshake over the first (control) stream, for both roles. See docs/NODE.md:
//   dialer   -> STREAM(control), HELLO(nonce_d, boot_d)
//   acceptor -> CHALLENGE(nonce_a, boot_a, proof_a)     proof_a = proof(acceptor -> dialer)
//   dialer   -> PROOF(proof_d)                          proof_d = proof(dialer -> acceptor)
//   acceptor -> WELCOME, TLS_OFFER(offer or none)      (or REFUSE(reason) and close, either side)
//   dialer   -> PATH(tls | iroh)                       after trying the offer (node/transport/tls_path.ts)
//   dialer   -> STREAM(data) on a second stream        only when PATH says iroh
// Nothing else is read or delivered before WELCOME; a wrong proof or protocol version refuses the peer.
import type { BiStream } from "@number0/iroh";
import {
  CONTROL_MAX_BYTES,
  type DataPath,
  decodeChallenge,
  decodeHello,
  decodePath,
  decodeProof,
  decodeRefuse,
  decodeStream,
  decodeTlsOffer,
  encodeChallenge,
  encodeFrame,
  encodeHello,
  encodePath,
  encodeProof,
  encodeRefuse,
  encodeStream,
  encodeTlsOffer,
  type Frame,
  FrameKind,
  HANDSHAKE_MAX_BYTES,
  type TlsOffer,
} from "../wire/mod.ts";
import { computeProof, newNonce, verifyProof } from "./handshake.ts";
import { FrameReader, irohSource } from "./frame_reader.ts";
import { toNumberArray } from "./coalescer.ts";

/** The peer was refused (or refused us); the message says why. */
export class HandshakeError extends Error {
  override name = "HandshakeError";
}

export interface HandshakeContext {
  key: CryptoKey;
  self: string;
  peer: string;
  boot: Uint8Array;
}

export interface HandshakeResult {
  reader: FrameReader;
  peerBoot: Uint8Array;
}

async function write(stream: BiStream, frames: Uint8Array[]): Promise<void> {
  const out: number[] = [];
  for (const f of frames) for (const b of f) out.push(b);
  await stream.send.writeAll(out);
}

/** A BiStream's send side as a coalescer sink (bytes converted to the binding's Array<number>). */
export function irohSink(stream: BiStream): (bytes: Uint8Array) => Promise<void> {
  return (bytes) => stream.send.writeAll(toNumberArray(bytes));
}

async function expect(reader: FrameReader, kind: FrameKind, what: string): Promise<Frame> {
  const f = await reader.next();
  if (f === null) throw new HandshakeError(`${what}: the peer closed the stream`);
  if (f.kind === FrameKind.REFUSE) {
    throw new HandshakeError(`refused by peer: ${decodeRefuse(f.payload).reason}`);
  }
  if (f.kind !== kind) throw new HandshakeError(`${what}: expected frame kind ${kind}, got ${f.kind}`);
  return f;
}

async function refuse(stream: BiStream, reason: string): Promise<never> {
  await write(stream, [encodeFrame(FrameKind.REFUSE, encodeRefuse(reason))]).catch(() => {});
  throw new HandshakeError(reason);
}

/** The dialer's side; its result also holds the acceptor's TLS offer (null: none). */
export async function dialerHandshake(
  ctl: BiStream,
  ctx: HandshakeContext,
): Promise<HandshakeResult & { offer: TlsOffer | null }> {
  const nonce = newNonce();
  await write(ctl, [
    encodeFrame(FrameKind.STREAM, encodeStream("control")),
    encodeFrame(FrameKind.HELLO, encodeHello({ nonce, boot: ctx.boot })),
  ]);
  const reader = new FrameReader(irohSource(ctl.recv), HANDSHAKE_MAX_BYTES);
  const ch = decodeChallenge((await expect(reader, FrameKind.CHALLENGE, "handshake")).payload);
  const theirs = { prover: ctx.peer, verifier: ctx.self, proverNonce: ch.nonce, verifierNonce: nonce };
  if (!(await verifyProof(ctx.key, theirs, ch.proof))) {
    await refuse(ctl, "the peer's proof of the cluster secret is wrong");
  }
  const mine = await computeProof(ctx.key, {
    prover: ctx.self,
    verifier: ctx.peer,
    proverNonce: nonce,
    verifierNonce: ch.nonce,
  });
  await write(ctl, [encodeFrame(FrameKind.PROOF, encodeProof(mine))]);
  await expect(reader, FrameKind.WELCOME, "handshake");
  const offer = decodeTlsOffer((await expect(reader, FrameKind.TLS_OFFER, "handshake")).payload);
  return { reader, peerBoot: ch.boot, offer };
}

/**
 * The acceptor's side. `offer` (made once the peer's id is known, before anything is sent) goes out with
 * WELCOME; null offers no TLS path.
 */
export async function acceptorHandshake(
  ctl: BiStream,
  ctx: HandshakeContext,
  offer: () => TlsOffer | null,
): Promise<HandshakeResult> {
  const reader = new FrameReader(irohSource(ctl.recv), HANDSHAKE_MAX_BYTES);
  const channel = decodeStream((await expect(reader, FrameKind.STREAM, "handshake")).payload);
  if (channel !== "control") await refuse(ctl, `the first stream must be "control", got "${channel}"`);
  const hello = decodeHello((await expect(reader, FrameKind.HELLO, "handshake")).payload);
  const nonce = newNonce();
  const proof = await computeProof(ctx.key, {
    prover: ctx.self,
    verifier: ctx.peer,
    proverNonce: nonce,
    verifierNonce: hello.nonce,
  });
  await write(ctl, [encodeFrame(FrameKind.CHALLENGE, encodeChallenge({ nonce, boot: ctx.boot, proof }))]);
  const p = decodeProof((await expect(reader, FrameKind.PROOF, "handshake")).payload);
  const theirs = { prover: ctx.peer, verifier: ctx.self, proverNonce: hello.nonce, verifierNonce: nonce };
  if (!(await verifyProof(ctx.key, theirs, p.proof))) await refuse(ctl, "wrong proof of the cluster secret");
  await write(ctl, [
    encodeFrame(FrameKind.WELCOME, new Uint8Array(0)),
    encodeFrame(FrameKind.TLS_OFFER, encodeTlsOffer(offer())),
  ]);
  return { reader, peerBoot: hello.boot };
}

/** The dialer's decision on the data channel's path. */
export async function sendPath(ctl: BiStream, path: DataPath): Promise<void> {
  await write(ctl, [encodeFrame(FrameKind.PATH, encodePath(path))]);
}

/** The acceptor reads the dialer's decision. */
export async function readPath(reader: FrameReader): Promise<DataPath> {
  // The dialer has proved the secret, and its first control messages may follow PATH in the same read:
  // they are decoded with the control channel's limit, not the handshake's (a 1.3 KB gossip message right
  // behind PATH was refused as an oversized handshake frame).
  reader.messageMax = CONTROL_MAX_BYTES;
  return decodePath((await expect(reader, FrameKind.PATH, "handshake")).payload);
}

/** Opens the data stream (dialer side) and announces its channel. */
export async function openDataStream(
  conn: { openBi(): Promise<BiStream> },
): Promise<BiStream> {
  const data = await conn.openBi();
  await write(data, [encodeFrame(FrameKind.STREAM, encodeStream("data"))]);
  return data;
}

/** Accepts the data stream (acceptor side) and checks its channel. */
export async function acceptDataStream(
  conn: { acceptBi(): Promise<BiStream> },
  messageMax: number,
): Promise<{ stream: BiStream; reader: FrameReader }> {
  const stream = await conn.acceptBi();
  const reader = new FrameReader(irohSource(stream.recv), messageMax);
  const channel = decodeStream((await expect(reader, FrameKind.STREAM, "data stream")).payload);
  if (channel !== "data") throw new HandshakeError(`the second stream must be "data", got "${channel}"`);
  return { stream, reader };
}
