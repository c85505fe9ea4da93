// The admission proof: each side of a new connection shows it holds the cluster secret, bound to both
// endpoint ids and to both sides' fresh nonces, so a proof can be neither replayed on another connection nor
// reflected back at its sender. iroh has already authenticated the endpoint ids (they are the TLS keys), so
// a peer that passes is a ticket holder speaking from the identity it claims.
//
//   proof(prover, verifier) = HMAC-SHA256(secret, label || prover id || verifier id ||
//                                                 verifier nonce || prover nonce)
//
// label is "swactor-v1" in the iroh handshake and "swactor-tls-v1" on the TLS data path, whose verifier
// nonce is the one-time token the acceptor sent over the authenticated iroh connection.
import { hexToBytes } from "../ticket.ts";

/** The iroh handshake's label. */
export const IROH_PROOF_LABEL = "swactor-v1";
/** The TLS data path's label (node/transport/tls_path.ts): its proofs never pass for the handshake's. */
export const TLS_PROOF_LABEL = "swactor-tls-v1";

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

export async function computeProof(
  key: CryptoKey,
  p: ProofInput,
  label = IROH_PROOF_LABEL,
): Promise<Uint8Array> {
  const tag = new TextEncoder().encode(label);
  const msg = new Uint8Array(tag.length + 64 + p.verifierNonce.length + p.proverNonce.length);
  let o = 0;
  for (const part of [tag, hexToBytes(p.prover), hexToBytes(p.verifier), p.verifierNonce, p.proverNonce]) {
    msg.set(part, o);
    o += part.length;
  }
  return new Uint8Array(await crypto.subtle.sign("HMAC", key, msg));
}

/** Checks a received proof in constant time. */
export async function verifyProof(
  key: CryptoKey,
  p: ProofInput,
  proof: Uint8Array,
  label = IROH_PROOF_LABEL,
): Promise<boolean> {
  const want = await computeProof(key, p, label);
  if (proof.length !== want.length) return false;
  let diff = 0;
  for (let i = 0; i < want.length; i++) diff |= want[i] ^ proof[i];
  return diff === 0;
}

export function newNonce(): Uint8Array {
  return crypto.getRandomValues(new Uint8Array(32));
}
