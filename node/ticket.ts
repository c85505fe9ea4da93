// The ticket: everything a node needs to join a cluster, as one copy-pasteable string.
//
//   "swactor1" + base32(lowercase, no padding) of
//     version u8 (=2) | secret 32 bytes | leader endpoint id 32 bytes |
//     address count u8 | per address: u8 length + UTF-8 "ip:port" |
//     relay: u8 length + UTF-8 ("n0", a relay URL, or length 0 for none) | crc32 (u32 BE) of everything before
// Version 1 tickets (no relay field) are still read.
//
// The secret is what a node proves it holds in the connection handshake (node/transport/handshake.ts);
// whoever has the ticket can join, so it is to be shared like a password.
import type { PeerAddr } from "./transport/transport.ts";

export const TICKET_PREFIX = "swactor1";
export const TICKET_VERSION = 2;
export const SECRET_BYTES = 32;

export interface Ticket {
  version: number;
  /** The cluster secret (32 random bytes). */
  secret: Uint8Array;
  /** The leader's endpoint id (64 hex chars) and its direct addresses. */
  leader: PeerAddr;
  /**
   * The cluster's relay: "n0" (n0's public relays and discovery) or a relay URL; absent for none. Joiners
   * use it unless told otherwise (`join --relay`), so every node of the cluster can reach the others' homes.
   */
  relay?: string;
}

/** 32 fresh random bytes for a new cluster. */
export function newSecret(): Uint8Array {
  return crypto.getRandomValues(new Uint8Array(SECRET_BYTES));
}

export function encodeTicket(ticket: Omit<Ticket, "version">): string {
  if (ticket.secret.length !== SECRET_BYTES) {
    throw new RangeError(`ticket secret must be ${SECRET_BYTES} bytes, got ${ticket.secret.length}`);
  }
  const id = hexToBytes(ticket.leader.id);
  if (ticket.leader.addrs.length > 255) throw new RangeError("a ticket holds at most 255 addresses");
  const parts: number[] = [TICKET_VERSION, ...ticket.secret, ...id, ticket.leader.addrs.length];
  for (const a of ticket.leader.addrs) {
    const b = new TextEncoder().encode(a);
    if (b.length > 255) throw new RangeError(`address too long: ${a}`);
    parts.push(b.length, ...b);
  }
  const relay = new TextEncoder().encode(ticket.relay ?? "");
  if (relay.length > 255) throw new RangeError(`relay URL too long: ${ticket.relay}`);
  parts.push(relay.length, ...relay);
  const body = Uint8Array.from(parts);
  const sum = crc32(body);
  const all = new Uint8Array(body.length + 4);
  all.set(body);
  new DataView(all.buffer).setUint32(body.length, sum);
  return TICKET_PREFIX + base32Encode(all);
}

/** Parses a ticket string; throws TypeError naming what is wrong. */
export function parseTicket(text: string): Ticket {
  const s = text.trim();
  if (!s.startsWith(TICKET_PREFIX)) {
    throw new TypeError(`ticket must start with "${TICKET_PREFIX}", got "${s.slice(0, 12)}..."`);
  }
  const bytes = base32Decode(s.slice(TICKET_PREFIX.length));
  if (bytes.length < 1 + SECRET_BYTES + 32 + 1 + 4) {
    throw new TypeError(`ticket is truncated (${bytes.length} bytes decoded)`);
  }
  const body = bytes.subarray(0, bytes.length - 4);
  const sum = new DataView(bytes.buffer, bytes.byteOffset + body.length, 4).getUint32(0);
  if (crc32(body) !== sum) {
    throw new TypeError("ticket checksum mismatch: the ticket was mistyped or cut short");
  }
  const version = body[0];
  if (version !== 1 && version !== TICKET_VERSION) {
    throw new TypeError(
      `ticket version ${version} is not supported (this build reads versions 1 and ${TICKET_VERSION})`,
    );
  }
  let pos = 1;
  const secret = body.slice(pos, pos + SECRET_BYTES);
  pos += SECRET_BYTES;
  const id = bytesToHex(body.subarray(pos, pos + 32));
  pos += 32;
  const count = body[pos++];
  const addrs: string[] = [];
  for (let i = 0; i < count; i++) {
    const n = body[pos++];
    if (n === undefined || pos + n > body.length) throw new TypeError(`ticket address ${i} is truncated`);
    addrs.push(new TextDecoder().decode(body.subarray(pos, pos + n)));
    pos += n;
  }
  let relay: string | undefined;
  if (version >= 2) {
    const n = body[pos++];
    if (n === undefined || pos + n > body.length) throw new TypeError("ticket relay is truncated");
    if (n > 0) relay = new TextDecoder().decode(body.subarray(pos, pos + n));
    pos += n;
  }
  if (pos !== body.length) throw new TypeError(`ticket has ${body.length - pos} unexpected trailing bytes`);
  return relay === undefined
    ? { version, secret, leader: { id, addrs } }
    : { version, secret, leader: { id, addrs }, relay };
}

const ALPHABET = "abcdefghijklmnopqrstuvwxyz234567";

function base32Encode(bytes: Uint8Array): string {
  let out = "", bits = 0, value = 0;
  for (const b of bytes) {
    value = (value << 8) | b;
    bits += 8;
    while (bits >= 5) {
      out += ALPHABET[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += ALPHABET[(value << (5 - bits)) & 31];
  return out;
}

function base32Decode(text: string): Uint8Array {
  const out: number[] = [];
  let bits = 0, value = 0;
  for (const ch of text.toLowerCase()) {
    const v = ALPHABET.indexOf(ch);
    if (v < 0) throw new TypeError(`ticket contains "${ch}", which is not a base32 character (a-z, 2-7)`);
    value = ((value << 5) | v) & 0xffff;
    bits += 5;
    if (bits >= 8) {
      out.push((value >>> (bits - 8)) & 255);
      bits -= 8;
    }
  }
  return Uint8Array.from(out);
}

export function hexToBytes(hex: string): Uint8Array {
  if (!/^[0-9a-f]{64}$/.test(hex)) {
    throw new TypeError(`endpoint id must be 64 lowercase hex chars, got "${hex}"`);
  }
  return Uint8Array.from({ length: 32 }, (_, i) => parseInt(hex.slice(2 * i, 2 * i + 2), 16));
}

export function bytesToHex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

let CRC_TABLE: Uint32Array | undefined;

function crc32(bytes: Uint8Array): number {
  if (!CRC_TABLE) {
    CRC_TABLE = new Uint32Array(256);
    for (let n = 0; n < 256; n++) {
      let c = n;
      for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
      CRC_TABLE[n] = c >>> 0;
    }
  }
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 255] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}
