// Keeps datagrams in order on a node:dgram socket under Deno 2.9.6.
//
// Measured: sends issued on a socket before its first send has completed leave in REVERSE order
// (0..9 arrive as 9..0, also on a connected socket); once one send has completed, back-to-back sends
// keep their order (checked with bursts of thousands). A relay must not invent reordering, so the first
// send goes alone and everything issued meanwhile waits in a FIFO until its callback.

import type dgram from "node:dgram";
import type { Buffer } from "node:buffer";

type Done = (err: Error | null) => void;

/** Sends on `socket` in the order `send` is called. */
export class OrderedSender {
  readonly #socket: dgram.Socket;
  #state: "cold" | "warming" | "warm" = "cold";
  readonly #waiting: [Buffer, number, string, Done][] = [];

  constructor(socket: dgram.Socket) {
    this.#socket = socket;
  }

  send(msg: Buffer, port: number, host: string, done: Done): void {
    if (this.#state === "warm") return void this.#socket.send(msg, port, host, done);
    if (this.#state === "warming") return void this.#waiting.push([msg, port, host, done]);
    this.#state = "warming";
    this.#socket.send(msg, port, host, (err) => {
      this.#state = "warm";
      done(err);
      for (const [m, p, h, d] of this.#waiting.splice(0)) this.#socket.send(m, p, h, d);
    });
  }
}
