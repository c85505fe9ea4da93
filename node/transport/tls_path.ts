// The TLS data path: a direct TLS-over-TCP connection per peer that carries the data channel (activations)
// at hundreds of MB/s, where the iroh binding's Array<number> conversions allow a few MB/s (docs/WIRE.md).
// iroh stays in charge of identity, hole punching, relays and the control channel; this path is only ever
// opened from an authenticated iroh connection:
//
//   acceptor -> (iroh control) TLS_OFFER(token, certificate, addresses)   token: 32 fresh random bytes
//   dialer   -> TCP connect, TLS with that certificate pinned (the dialer's only CA for this connection)
//   dialer   -> (TLS) TLS_HELLO(token, nonce_d, proof_d)    proof_d = proof(dialer -> acceptor), verifier
//                                                           nonce = token, label "swactor-tls-v1"
//   acceptor -> (TLS) PROOF(proof_a)                        proof_a = proof(acceptor -> dialer), verifier
//                                                           nonce = nonce_d; or REFUSE and close
//   dialer   -> (iroh control) PATH(tls | iroh)             the dialer's decision, read by the acceptor
//
// So the TLS server is the peer that sent the offer (it holds the certificate's key; the offer came over
// iroh, which authenticated the peer's id and its proof of the secret); the TLS client is the peer the
// token was offered to (the token travelled only inside two encrypted channels to it) and holds the secret
// too (proof_d, bound to both ids). A token admits one connection, once, while its offer is pending.
import tls from "node:tls";
import type { AddressInfo } from "node:net";
import { certificatePem, createFastCertificate, FAST_SERVER_NAME, type FastCertificate } from "./cert.ts";
import { computeProof, newNonce, TLS_PROOF_LABEL, verifyProof } from "./handshake.ts";
import { FrameReader } from "./frame_reader.ts";
import { type ByteConn, denoByteConn, nodeByteConn } from "./byte_conn.ts";
import {
  decodeProof,
  decodeRefuse,
  decodeTlsHello,
  encodeFrame,
  encodeProof,
  encodeRefuse,
  encodeTlsHello,
  type Frame,
  FrameKind,
  HANDSHAKE_MAX_BYTES,
  type TlsOffer,
} from "../wire/mod.ts";
import type { PeerId } from "./transport.ts";

/** An authenticated TLS connection and the reader that already holds whatever followed the handshake. */
export interface TlsStream {
  conn: ByteConn;
  reader: FrameReader;
}

/** An offer made to one peer; the acceptor takes its connection once the dialer says PATH(tls). */
export interface PendingOffer {
  offer: TlsOffer;
  /** The connection the dialer opened with this offer's token, if it did (and proved the secret). */
  take(): TlsStream | undefined;
  /** Withdraws the token; closes a connection nobody took. */
  cancel(): void;
}

export interface TlsPathOptions extends TlsDialContext {
  /** Where to listen, "host:port" (port 0: any free port). */
  listen: string;
  /** The addresses to offer when listening on a wildcard address: this node's reachable IPs (any port). */
  advertise?: () => string[];
  /** Give up on a TLS connection's handshake after this long (default 5000 ms). */
  handshakeTimeoutMs?: number;
}

/** A refusal on the TLS path (wrong token, wrong proof, or the peer refused us); the message says why. */
export class TlsPathError extends Error {
  override name = "TlsPathError";
}

export class TlsPath {
  #pending = new Map<string, { peer: PeerId; stream?: TlsStream }>();
  #closed = false;
  readonly #advertise: () => string[];

  private constructor(
    readonly server: tls.Server,
    readonly cert: FastCertificate,
    readonly opts: TlsPathOptions,
  ) {
    this.#advertise = opts.advertise ?? (() => []);
    server.on("secureConnection", (socket: tls.TLSSocket) => {
      socket.setNoDelay(true);
      this.#accept(nodeByteConn(socket));
    });
    server.on("tlsClientError", (e: Error, socket: tls.TLSSocket) => {
      this.opts.log(
        "warn",
        `refused TLS connection from ${socket.remoteAddress}: ${e.message.split("\n")[0]}`,
      );
    });
  }

  /**
   * Makes a certificate and listens. Throws when the address cannot be bound (an Error whose `code` is
   * "EADDRINUSE" when the port is taken).
   */
  static async start(opts: TlsPathOptions): Promise<TlsPath> {
    const cert = await createFastCertificate();
    const { host, port } = splitHostPort(opts.listen);
    const server = tls.createServer({
      cert: cert.certPem,
      key: cert.keyPem,
      minVersion: "TLSv1.3",
      noDelay: true,
      handshakeTimeout: opts.handshakeTimeoutMs ?? 5000,
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, host, () => {
        server.off("error", reject);
        resolve();
      });
    });
    return new TlsPath(server, cert, opts);
  }

  /** The listener's address, "host:port" as bound (a wildcard host when listening on all interfaces). */
  get addr(): string {
    const a = this.server.address() as AddressInfo;
    return joinHostPort(a.address, a.port);
  }

  /** Addresses a peer may dial: the bound one, or with a wildcard host, the advertised IPs at our port. */
  addrs(): string[] {
    const a = this.server.address() as AddressInfo;
    if (a.address !== "0.0.0.0" && a.address !== "::") return [this.addr];
    const ips = this.#advertise().map((x) => splitHostPort(x).host);
    return [...new Set(ips)].map((ip) => joinHostPort(ip, a.port)).slice(0, 8);
  }

  /** A fresh one-time offer for `peer` (the iroh connection's authenticated id); none once closed. */
  offer(peer: PeerId): PendingOffer | undefined {
    if (this.#closed) return undefined;
    const token = newNonce();
    const key = hex(token);
    this.#pending.set(key, { peer });
    const offer = { token, cert: this.cert.der, addrs: this.addrs() };
    return {
      offer,
      take: () => {
        const p = this.#pending.get(key);
        this.#pending.delete(key);
        return p?.stream;
      },
      cancel: () => {
        const p = this.#pending.get(key);
        this.#pending.delete(key);
        p?.stream?.conn.close();
      },
    };
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.server.close();
    for (const p of this.#pending.values()) p.stream?.conn.close();
    this.#pending.clear();
  }

  async #accept(conn: ByteConn): Promise<void> {
    try {
      await timed(this.#acceptHandshake(conn), this.opts.handshakeTimeoutMs ?? 5000, "TLS_HELLO");
    } catch (e) {
      const why = (e as Error).message.split("\n")[0];
      this.opts.log("warn", `refused TLS connection from ${conn.remote}: ${why}`);
      await conn.write(encodeFrame(FrameKind.REFUSE, encodeRefuse(why))).catch(() => {});
      conn.close();
    }
  }

  async #acceptHandshake(conn: ByteConn): Promise<void> {
    const reader = new FrameReader(conn.read, HANDSHAKE_MAX_BYTES);
    const f = await nextFrame(reader);
    if (f.kind !== FrameKind.TLS_HELLO) {
      throw new TlsPathError(`expected TLS_HELLO, got frame kind ${f.kind}`);
    }
    const hello = decodeTlsHello(f.payload);
    const key = hex(hello.token);
    const pending = this.#pending.get(key);
    if (!pending || pending.stream) throw new TlsPathError("its token matches no pending offer");
    const mine = {
      prover: pending.peer,
      verifier: this.opts.self,
      proverNonce: hello.nonce,
      verifierNonce: hello.token,
    };
    if (!(await verifyProof(this.opts.key, mine, hello.proof, TLS_PROOF_LABEL))) {
      throw new TlsPathError("wrong proof of the cluster secret");
    }
    if (this.#pending.get(key) !== pending) throw new TlsPathError("its offer was withdrawn");
    pending.stream = { conn, reader };
    const proof = await computeProof(this.opts.key, {
      prover: this.opts.self,
      verifier: pending.peer,
      proverNonce: hello.token,
      verifierNonce: hello.nonce,
    }, TLS_PROOF_LABEL);
    await conn.write(encodeFrame(FrameKind.PROOF, encodeProof(proof)));
  }
}

/** What the dialing side needs: no listener, only the secret and its own id. */
export interface TlsDialContext {
  key: CryptoKey;
  self: PeerId;
  log: (level: "info" | "warn", msg: string) => void;
}

/**
 * Opens the TLS path to `peer` with its offer: tries each address in turn (TCP connect, TLS with the
 * offered certificate pinned, TLS_HELLO, the peer's PROOF) until `timeoutMs` is spent. Throws saying why
 * the last attempt failed; a refusal (TlsPathError) is also logged as a warning.
 */
export async function dialTlsPath(
  ctx: TlsDialContext,
  peer: PeerId,
  offer: TlsOffer,
  addrs: string[],
  timeoutMs: number,
): Promise<TlsStream> {
  const deadline = performance.now() + timeoutMs;
  let last = "no address to dial";
  for (const addr of addrs) {
    const left = deadline - performance.now();
    if (left <= 0) break;
    let tcp: Deno.TcpConn | undefined;
    let conn: Deno.TlsConn | undefined;
    try {
      const { host, port } = splitHostPort(addr);
      tcp = await timed(Deno.connect({ hostname: host, port }), left, "TCP connect", (c) => c.close());
      tcp.setNoDelay(true);
      conn = await Deno.startTls(tcp, { hostname: FAST_SERVER_NAME, caCerts: [certificatePem(offer.cert)] });
      tcp = undefined; // owned by the TLS connection now
      const c = conn;
      return await timed(dialHandshake(ctx, c, peer, offer), deadline - performance.now(), "TLS handshake");
    } catch (e) {
      last = `${addr}: ${(e as Error).message.split("\n")[0]}`;
      if (e instanceof TlsPathError) ctx.log("warn", `TLS path to ${peer.slice(0, 10)}: ${last}`);
      try {
        (conn ?? tcp)?.close();
      } catch { /* closed */ }
    }
  }
  throw new Error(last);
}

async function dialHandshake(
  ctx: TlsDialContext,
  tlsConn: Deno.TlsConn,
  peer: PeerId,
  offer: TlsOffer,
): Promise<TlsStream> {
  await tlsConn.handshake();
  const conn = denoByteConn(tlsConn);
  const nonce = newNonce();
  const proof = await computeProof(ctx.key, {
    prover: ctx.self,
    verifier: peer,
    proverNonce: nonce,
    verifierNonce: offer.token,
  }, TLS_PROOF_LABEL);
  await conn.write(encodeFrame(FrameKind.TLS_HELLO, encodeTlsHello({ token: offer.token, nonce, proof })));
  const reader = new FrameReader(conn.read, HANDSHAKE_MAX_BYTES);
  const f = await nextFrame(reader);
  if (f.kind === FrameKind.REFUSE) {
    throw new TlsPathError(`refused by peer: ${decodeRefuse(f.payload).reason}`);
  }
  if (f.kind !== FrameKind.PROOF) throw new TlsPathError(`expected PROOF, got frame kind ${f.kind}`);
  const theirs = { prover: peer, verifier: ctx.self, proverNonce: offer.token, verifierNonce: nonce };
  if (!(await verifyProof(ctx.key, theirs, decodeProof(f.payload).proof, TLS_PROOF_LABEL))) {
    throw new TlsPathError("the peer's proof of the cluster secret is wrong");
  }
  return { conn, reader };
}

async function nextFrame(reader: FrameReader): Promise<Frame> {
  const f = await reader.next();
  if (f === null) throw new TlsPathError("the peer closed the connection");
  return f;
}

/** "host:port" or "[v6]:port" -> parts (host without brackets). Throws TypeError naming the bad address. */
export function splitHostPort(addr: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(addr);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) throw new TypeError(`expected HOST:PORT (or [IPv6]:PORT), got "${addr}"`);
  return { host: m[1] ?? m[2], port };
}

export function joinHostPort(host: string, port: number): string {
  return host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
}

function hex(b: Uint8Array): string {
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

/** Races `p` against a timer; a result that arrives too late is disposed of. */
function timed<T>(p: Promise<T>, ms: number, what: string, dispose?: (v: T) => void): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  let late = false;
  return Promise.race([
    p.then((v) => {
      if (late) dispose?.(v);
      return v;
    }),
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        late = true;
        reject(new Error(`${what} timed out after ${Math.round(ms)} ms`));
      }, Math.max(0, ms));
    }),
  ]).finally(() => clearTimeout(timer));
}
