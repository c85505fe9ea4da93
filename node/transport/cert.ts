// A self-signed TLS certificate for the fast path (node/transport/fast_path.ts), made with WebCrypto and a
// few lines of DER: an Ed25519 key per process run, subject and DNS name `swactor.invalid`, valid from 2020
// to 2049 (fixed, so clock skew between machines never matters). Nobody trusts it by name: a peer learns the
// certificate over the authenticated iroh connection and pins exactly it (it is the dialer's only CA), so
// the fast path's server is the peer that sent it, and the name merely has to match.

/** The name in the certificate and the one the dialer verifies. `.invalid` is never issued publicly. */
export const FAST_SERVER_NAME = "swactor.invalid";

export interface FastCertificate {
  /** The certificate, DER (what OFFER carries: a few hundred bytes). */
  der: Uint8Array;
  /** The certificate, PEM (for Deno.listenTls and the dialer's caCerts). */
  certPem: string;
  /** The private key, PKCS#8 PEM (for Deno.listenTls). */
  keyPem: string;
}

const ED25519 = [1, 3, 101, 112];
const COMMON_NAME = [2, 5, 4, 3];
const SUBJECT_ALT_NAME = [2, 5, 29, 17];

/** A fresh key and its self-signed certificate. */
export async function createFastCertificate(): Promise<FastCertificate> {
  const keys = await crypto.subtle.generateKey({ name: "Ed25519" }, true, [
    "sign",
    "verify",
  ]) as CryptoKeyPair;
  const spki = new Uint8Array(await crypto.subtle.exportKey("spki", keys.publicKey));
  const pkcs8 = new Uint8Array(await crypto.subtle.exportKey("pkcs8", keys.privateKey));
  const serial = crypto.getRandomValues(new Uint8Array(16));
  serial[0] &= 0x7f; // a positive INTEGER
  serial[0] |= 0x01; // and no leading zero byte to strip
  const algorithm = seq(oid(ED25519));
  const name = seq(set(seq(oid(COMMON_NAME), tlv(0x0c, utf8(FAST_SERVER_NAME)))));
  const san = seq(oid(SUBJECT_ALT_NAME), tlv(0x04, seq(tlv(0x82, utf8(FAST_SERVER_NAME)))));
  const tbs = seq(
    tlv(0xa0, tlv(0x02, [2])), // version 3
    tlv(0x02, serial),
    algorithm,
    name,
    seq(tlv(0x17, ascii("200101000000Z")), tlv(0x17, ascii("491231235959Z"))),
    name,
    spki,
    tlv(0xa3, seq(san)),
  );
  const signature = new Uint8Array(
    await crypto.subtle.sign("Ed25519", keys.privateKey, tbs as Uint8Array<ArrayBuffer>),
  );
  const der = seq(tbs, algorithm, tlv(0x03, concat([new Uint8Array([0]), signature])));
  return { der, certPem: pem("CERTIFICATE", der), keyPem: pem("PRIVATE KEY", pkcs8) };
}

/** PEM of a DER certificate (the dialer's caCerts entry for a pinned peer). */
export function certificatePem(der: Uint8Array): string {
  return pem("CERTIFICATE", der);
}

function pem(label: string, der: Uint8Array): string {
  const b64 = btoa(String.fromCharCode(...der));
  const lines = b64.match(/.{1,64}/g) ?? [];
  return `-----BEGIN ${label}-----\n${lines.join("\n")}\n-----END ${label}-----\n`;
}

function tlv(tag: number, body: ArrayLike<number>): Uint8Array {
  const n = body.length;
  const len = n < 0x80 ? [n] : n < 0x100 ? [0x81, n] : [0x82, n >> 8, n & 255];
  const out = new Uint8Array(1 + len.length + n);
  out[0] = tag;
  out.set(len, 1);
  out.set(body, 1 + len.length);
  return out;
}

function seq(...parts: Uint8Array[]): Uint8Array {
  return tlv(0x30, concat(parts));
}

function set(...parts: Uint8Array[]): Uint8Array {
  return tlv(0x31, concat(parts));
}

function oid(arcs: number[]): Uint8Array {
  const out = [40 * arcs[0] + arcs[1]];
  for (const arc of arcs.slice(2)) {
    const b7: number[] = [];
    for (let v = arc; b7.length === 0 || v > 0; v = Math.floor(v / 128)) b7.unshift(v % 128);
    out.push(...b7.map((b, i) => (i < b7.length - 1 ? b | 0x80 : b)));
  }
  return tlv(0x06, out);
}

function utf8(s: string): Uint8Array {
  return new TextEncoder().encode(s);
}

const ascii = utf8;

function concat(parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p, o);
    o += p.length;
  }
  return out;
}
