// The admission proof: each side of a new connection shows it holds the cluster secret, bound to both
// endpoint ids and to both sides' fresh nonces, so a proof can be neither replayed on another connection nor
// reflected back at its sender. iroh has already authenticated the endpoint ids (they are the TLS keys), so
// a peer that passes is a ticket holder speaking from the identity it claims.
//
//   proof(prover, verifier) = HMAC-SHA256(secret, "swactor-v1" || prover id || verifier id ||
//                                                 verifier nonce || prover nonce)
import { hexToBytes } from "../ticket.ts";

const LABEL = new TextEncoder().encode("swactor-v1");

/** Imports the cluster secret once as an HMAC key. */
export function importSecret(secret: Uint8Array): Promise<CryptoKey> {
  return crypto.subtle.importKey(
    "raw",
    secret as Uint8Array<ArrayBuffer>,
    { name: "HMAC", hash: "SHA-256" },
    false,
    [
      "sign",
    ],
  );
}

export interface ProofInput {
  prover: string;
  verifier: string;
  proverNonce: Uint8Array;
  verifierNonce: Uint8Array;
}

export async function computeProof(key: CryptoKey, p: ProofInput): Promise<Uint8Array> {
  const msg = new Uint8Array(LABEL.length + 64 + p.verifierNonce.length + p.proverNonce.length);
  let o = 0;
  for (const part of [LABEL, hexToBytes(p.prover), hexToBytes(p.verifier), p.verifierNonce, p.proverNonce]) {
    msg.set(part, o);
    o += part.length;
  }
  return new Uint8Array(await crypto.subtle.sign("HMAC", key, msg));
}

/** Checks a received proof in constant time. */
export async function verifyProof(key: CryptoKey, p: ProofInput, proof: Uint8Array): Promise<boolean> {
  const want = await computeProof(key, p);
  if (proof.length !== want.length) return false;
  let diff = 0;
  for (let i = 0; i < want.length; i++) diff |= want[i] ^ proof[i];
  return diff === 0;
}

export function newNonce(): Uint8Array {
  return crypto.getRandomValues(new Uint8Array(32));
}
