// The model runtime's thread (models/gpu_thread.ts starts it): loads stages and expert hosts onto this
// worker's GPU device and runs their calls, so that a pipeline compile or a blocking GPU wait holds this
// thread, not the node's (where membership answers its probes). Each object loaded here has a handle; the
// node's side calls its methods by handle (GpuRequest) and is answered in order of completion (GpuReply).
// A stage whose MoE layers' experts live on other nodes calls back for them (`fanout`, answered by the node).
import type { ExpertInput, LoopOptions } from "./backend.ts";
import { type Engine, loadEngine, loadExpertHost, servedForm } from "./engine.ts";
import type { ExpertHost } from "./experts.ts";
import type { GpuCallback, GpuMessage, GpuRequest, StageFacts, WireError } from "./gpu_thread.ts";

const stages = new Map<number, Engine>();
const hosts = new Map<number, ExpertHost>();
const aborts = new Map<string, AbortController>();
let nextHandle = 1;
let nextCallback = 1;
const callbacks = new Map<number, { resolve: (v: Float32Array) => void; reject: (e: Error) => void }>();

const post = (m: GpuMessage, transfer: Transferable[] = []) =>
  (self as unknown as Worker).postMessage(m, transfer);

function wireError(e: unknown): WireError {
  const err = e instanceof Error ? e : new Error(String(e));
  return { name: err.name, message: err.message, stack: err.stack };
}

function stage(handle: number): Engine {
  const s = stages.get(handle);
  if (!s) throw new Error(`no stage ${handle} on the GPU thread (closed?)`);
  return s;
}

async function handle(r: GpuRequest, id: number): Promise<{ value: unknown; transfer?: Transferable[] }> {
  switch (r.op) {
    case "stage": {
      const h = nextHandle++;
      const fanout = r.fanout
        ? (layer: number, input: ExpertInput) =>
          new Promise<Float32Array>((resolve, reject) => {
            const cb = nextCallback++;
            callbacks.set(cb, { resolve, reject });
            post({ kind: "callback", cb, call: { handle: h, layer, input } satisfies GpuCallback });
          })
        : undefined;
      const engine = await loadEngine(r.model.dir, {
        role: r.role,
        ...servedForm(r.model),
        onProgress: (done, total) => post({ kind: "event", id, event: { progress: [done, total] } }),
        remoteExperts: r.remote,
        fanout,
      });
      stages.set(h, engine);
      const facts: StageFacts = {
        handle: h,
        model: engine.model,
        weightBytes: engine.weights.weightBytes,
        chunk: engine.weights.stepChunkLimits(),
      };
      return { value: facts };
    }
    case "open": {
      // This request's KV bytes: what the stage holds after the open, less what it held before.
      const s = stage(r.handle);
      const before = s.stats().kvBytes;
      const { chunk } = s.open(r.id, r.opts);
      return { value: { chunk, kvBytes: s.stats().kvBytes - before } };
    }
    case "run": {
      const out = await stage(r.handle).run(r.id, r.input);
      const transfer = [out.hidden?.buffer, out.logits?.buffer].filter((b) => b !== undefined);
      return { value: out, transfer: transfer as ArrayBuffer[] };
    }
    case "generate": {
      const abort = new AbortController();
      aborts.set(`${r.handle}:${r.id}`, abort);
      try {
        const opts: LoopOptions & { signal: AbortSignal } = {
          ...r.opts,
          signal: abort.signal,
          onTokens: (ids) => post({ kind: "event", id, event: { tokens: ids } }),
        };
        return { value: await stage(r.handle).generate(r.id, r.prompt, opts) };
      } finally {
        aborts.delete(`${r.handle}:${r.id}`);
      }
    }
    case "abort":
      aborts.get(`${r.handle}:${r.id}`)?.abort();
      return { value: undefined };
    case "release":
      return { value: stage(r.handle).release(r.id) };
    case "closeStage":
      stages.get(r.handle)?.close();
      stages.delete(r.handle);
      return { value: undefined };
    case "experts": {
      const host = await loadExpertHost(new Map(r.hold), { model: r.model }) as ExpertHost;
      const h = nextHandle++;
      hosts.set(h, host);
      return {
        value: { handle: h, hidden: host.hidden, weightBytes: host.weightBytes, held: [...host.held()] },
      };
    }
    case "compute": {
      const host = hosts.get(r.handle);
      if (!host) throw new Error(`no expert host ${r.handle} on the GPU thread (closed?)`);
      const out = await host.compute(r.layer, r.input);
      return { value: out, transfer: [out.buffer as ArrayBuffer] };
    }
    case "closeExperts":
      hosts.get(r.handle)?.close();
      hosts.delete(r.handle);
      return { value: undefined };
  }
}

// This module runs as a Worker; the project's type-check library is the window's, hence the casts.
self.addEventListener("message", (e) => {
  const m = (e as MessageEvent<GpuMessage>).data;
  if (m.kind === "answer") {
    const cb = callbacks.get(m.cb);
    callbacks.delete(m.cb);
    if (!cb) return;
    if (m.ok) cb.resolve(m.value as Float32Array);
    else cb.reject(Object.assign(new Error(m.error.message), { name: m.error.name }));
    return;
  }
  if (m.kind !== "request") return;
  handle(m.request, m.id).then(
    ({ value, transfer }) => post({ kind: "reply", id: m.id, ok: true, value }, transfer),
    (err) => post({ kind: "reply", id: m.id, ok: false, error: wireError(err) }),
  );
});
