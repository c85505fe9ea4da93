// A node's part in the pipeline: follows the Assignment board, claims its stage (loads the backend, then
// spawns `stage-{i}`, which is also how it reports ready), keeps a client for requests made on this node,
// and reacts to membership (a dead client's requests are freed; a dead stage breaks the chain: its
// requests fail at the client and are freed everywhere).
import { type ActorSystem, PeerUnreachableError } from "../actors/mod.ts";
import { type Clock, SystemClock } from "../clock.ts";
import type { MemberChange } from "../membership/swim.ts";
import type { Membership } from "../membership/mod.ts";
import type { Registry } from "../registry/mod.ts";
import { type Assignment, AssignmentBoard } from "./assignment.ts";
import type { ExpertLoader, ExpertService, StageBackend, StageLoader } from "./backend.ts";
import { EXPERT_PREFIX, expertSet } from "./expert_names.ts";
import {
  createFanout,
  expertHostBehavior,
  expertHostName,
  expertPlacement,
  type FanoutRecord,
  fanoutTrace,
  heldBy,
  HOST_READY_MS,
  remoteLayers,
  servable,
} from "./experts.ts";
import { type Chain, type ChainLoss, PipelineClient } from "./client.ts";
import { breaking, ChainRecovery, lostStage, planNodes } from "./recovery.ts";
import type { Links } from "../links.ts";
import { encodePipe } from "./messages.ts";
import { sendWithRetry } from "./retry.ts";
import { rolesOf } from "./roles.ts";
import { StageActor, stageName } from "./stage_actor.ts";

export interface PipelineHost {
  membership: Membership;
  registry: Registry;
  actors: ActorSystem;
  /** Measured links, for re-plans (node/stage/recovery.ts); without it this node never re-plans. */
  links?: Links;
}

export interface PipelineOptions {
  /** Loads this node's stage (the model family's backend). */
  loader: StageLoader;
  /** Loads the routed experts the Plan gives this node (expert parallelism). Default: none can be held. */
  expertLoader?: ExpertLoader;
  /** Overrides the Assignment's checkpoint folder on this node (default: the Assignment's). */
  modelDir?: string;
  /** Client stall timeout, ms (default 30 000). */
  stallMs?: number;
  /** For the send retries' backoff (default: the system clock). */
  clock?: Clock;
  /** Default: messages to stderr. */
  log?: (msg: string) => void;
  /**
   * Survive the loss of a node (docs/RECOVERY.md): re-plan when this node leads (or takes the lead), and
   * resume this node's requests on the new chain. Default false: a lost stage fails its requests.
   */
  recover?: boolean;
  /** How long a request waits for a chain to resume on, ms (default 60 000). */
  resumeTimeoutMs?: number;
}

/** What this node does in the chain now. */
export interface LocalStage {
  planVersion: number;
  index: number;
  state: "loading" | "ready" | "failed";
  error?: string;
}

/** A stage's STATS reply. */
export interface StageReport {
  index: number;
  planVersion: number;
  node?: string;
  layers?: [number, number];
  active?: number;
  kvBytes?: number;
  weightBytes?: number;
  /** Bytes of released requests' sequences kept for reuse, and the requests that took one (StageStats). */
  spareBytes?: number;
  reuses?: number;
  requests?: string[];
  /** False while the stage cannot yet resolve the names it sends to. */
  routes?: boolean;
  error?: string;
}

export class PipelineNode {
  readonly board: AssignmentBoard;
  readonly client: PipelineClient;
  /** Re-plans after a loss (when `recover`: on whichever node leads). */
  readonly recovery: ChainRecovery | undefined;
  #host: PipelineHost;
  #o: PipelineOptions;
  #log: (msg: string) => void;
  #local: LocalStage | undefined;
  #actor: StageActor | undefined;
  #ref: { stop(): Promise<void> } | undefined;
  #hostRef: { stop(): Promise<void> } | undefined;
  /** What the running stage's backend was loaded for, when a later Plan may keep it (see #claim). */
  #kept: { key: string } | undefined;
  /** Per request, what this node's stage sent to expert hosts since its last step. */
  #fanout = new Map<string, FanoutRecord>();
  /** The expert hosts this node's stage sends to, each with what fails its calls when it is gone. */
  #hosts = new Map<string, AbortController>();
  #queue: Promise<void> = Promise.resolve();
  #unsubscribe: Array<() => void> = [];
  #closed = false;
  #clock: Clock;

  constructor(host: PipelineHost, opts: PipelineOptions) {
    this.#host = host;
    this.#clock = opts.clock ?? new SystemClock();
    this.#o = opts;
    this.#log = opts.log ?? ((m) => console.error(`swactor: ${m}`));
    this.board = new AssignmentBoard(host.membership);
    const actors = host.actors;
    this.client = new PipelineClient(
      {
        spawn: (name, b) => actors.spawn(name, b),
        send: (name, body, o) => this.#send(name, body, o?.channel),
      },
      host.membership.id,
      {
        stallMs: opts.stallMs,
        resume: opts.recover ? (loss, signal) => this.#resumeChain(loss, signal) : undefined,
      },
    );
    if (opts.recover && host.links) {
      this.recovery = new ChainRecovery(
        { membership: host.membership, actors: host.actors, links: host.links },
        this.board,
        { modelDir: opts.modelDir, log: this.#log },
      );
    }
    this.#unsubscribe.push(this.board.onChange((a) => {
      // Requests on an older chain are over there (their stages free them when they take the new roles).
      if (opts.recover) this.client.planChanged(a.version);
      this.#enqueue(() => this.#claim(a));
    }));
    this.#unsubscribe.push(host.membership.onChange((c) => this.#onMember(c)));
  }

  get local(): LocalStage | undefined {
    return this.#local;
  }

  /** The chain of the current Assignment (it may not be ready: see waitReady). */
  chain(): Chain | undefined {
    const a = this.board.current;
    return a && {
      version: a.version,
      nodes: a.plan.stages.map((s) => s.node),
      ...(a.wire ? { wire: a.wire } : {}),
    };
  }

  /** Asks every stage for its STATS (per stage: version, active requests, KV bytes; or an error). */
  async stageReports(opts: { timeoutMs?: number } = {}): Promise<StageReport[]> {
    const a = this.board.current;
    if (!a) return [];
    return await Promise.all(a.plan.stages.map(async (s, i): Promise<StageReport> => {
      try {
        const body = await this.#host.actors.call(stageName(i), encodePipe({ type: "stats" }), {
          timeoutMs: opts.timeoutMs ?? 3000,
        });
        return {
          ...JSON.parse(new TextDecoder().decode(body)),
          node: this.#host.registry.resolve(stageName(i)),
        };
      } catch (e) {
        return { index: i, planVersion: 0, node: s.node, error: (e as Error).message };
      }
    }));
  }

  /** Resolves with the chain once every stage of the current Assignment reports ready; Error on timeout or a failed stage. */
  async waitReady(opts: { timeoutMs?: number; signal?: AbortSignal; pollMs?: number } = {}): Promise<Chain> {
    const deadline = performance.now() + (opts.timeoutMs ?? 120_000);
    let last = "no Assignment yet";
    while (performance.now() < deadline) {
      opts.signal?.throwIfAborted();
      const a = this.board.current;
      if (a) {
        const reports = await this.stageReports({ timeoutMs: 2000 });
        const failed = reports.find((r) => r.error && r.planVersion === a.version);
        if (failed) throw new Error(`stage ${failed.index} could not load: ${failed.error}`);
        const waiting = reports.find((r, i) =>
          r.planVersion !== a.version || r.error || r.node !== a.plan.stages[i].node || r.routes === false
        );
        if (!waiting) return this.chain()!;
        last =
          `stage ${waiting.index} (node ${a.plan.stages[waiting.index].node.slice(0, 10)}) is not ready` +
          (waiting.error ? `: ${waiting.error}` : "");
      }
      await new Promise((r) => setTimeout(r, opts.pollMs ?? 250));
    }
    throw new Error(
      `the chain is not ready after ${Math.round((opts.timeoutMs ?? 120_000) / 1000)} s: ${last}`,
    );
  }

  /**
   * The chain a request resumes on after `loss`: once ready, a newer Plan's when the node is gone or any
   * node of the current Plan is (the leader re-plans), else the current one's (a stale stage or a failed hop
   * on a chain that is still whole), or a newer one if it comes within a few seconds.
   */
  async #resumeChain(
    loss: ChainLoss,
    signal?: AbortSignal,
  ): Promise<{ chain: Chain; lost?: { stage: number; node: string; reason: string } }> {
    const timeoutMs = this.#o.resumeTimeoutMs ?? 60_000;
    const deadline = performance.now() + timeoutMs;
    const grace = performance.now() + 3000;
    // A node of the current Plan is dead or left now (the leader re-plans), or suspect (membership decides
    // soon: re-sending on the chain meanwhile fails again, e.g. at a killed expert host). Not `loss.gone`
    // alone: a node falsely declared dead that refuted it is alive again, and the leader keeps its Plan.
    // An expert host whose experts all have live replicas breaks nothing (recovery.ts, breaking).
    const gone = () => {
      const a = this.board.current;
      if (!a) return true;
      return breaking(
        a.plan,
        [...planNodes(a.plan)].filter((n) => {
          const st = this.#host.membership.member(n)?.state;
          return st === "dead" || st === "left" || st === "suspect";
        }),
      ).length > 0;
    };
    while ((this.board.current?.version ?? 0) <= loss.version && (gone() || performance.now() < grace)) {
      signal?.throwIfAborted();
      if (this.#closed) throw new Error("the node is closing");
      if (performance.now() > deadline) {
        throw new Error(`no new Plan within ${Math.round(timeoutMs / 1000)} s of losing stage ${loss.stage}`);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    const chain = await this.waitReady({
      signal,
      timeoutMs: Math.max(1000, deadline - performance.now()),
      pollMs: 100,
    });
    // Name what was lost (recovery.ts lostStage).
    const old = loss.nodes ?? [];
    const state = (n: string) => this.#host.membership.member(n)?.state;
    const named = lostStage(old, chain.nodes, state, loss, this.board.current?.lost);
    if (!named) return { chain };
    const { stage, reason } = named;
    return {
      chain,
      lost: { stage, node: old[stage], reason: loss.gone ? loss.reason : `${reason} (${loss.reason} first)` },
    };
  }

  async close(): Promise<void> {
    this.#closed = true;
    await this.recovery?.close();
    for (const u of this.#unsubscribe) u();
    await this.client.close();
    await this.#queue;
    await this.#ref?.stop();
    await this.#hostRef?.stop();
    this.board.close();
  }

  /**
   * Sends by name, retrying with backoff (node/stage/retry.ts) while the target is unreachable or its name
   * is still on its way here by gossip (the leader saw every stage ready before this node's registry did),
   * but not once membership says the target's node is gone.
   */
  #send(name: string, body: Uint8Array, channel?: "control" | "data"): Promise<void> {
    return sendWithRetry((n, b) => this.#host.actors.send(n, b, { channel }), name, body, {
      clock: this.#clock,
      closed: () => this.#closed,
      gone: (n) => {
        const owner = this.#host.registry.resolve(n);
        const state = owner && this.#host.membership.member(owner)?.state;
        return state === "dead" || state === "left";
      },
      onRetry: (n, attempt, e) => {
        if (e instanceof PeerUnreachableError) {
          this.#log(`pipeline: send to ${n} failed (${e.message}); retry ${attempt}`);
        }
      },
    });
  }

  #enqueue(f: () => Promise<void>): void {
    this.#queue = this.#queue.then(f).catch((e) => this.#log(`pipeline: ${(e as Error).message}`));
  }

  async #claim(a: Assignment): Promise<void> {
    if (this.#closed || a !== this.board.current) return; // a newer one is queued
    const self = this.#host.membership.id;
    const roles = rolesOf(a.plan, a.layers);
    const index = a.plan.stages.findIndex((s) => s.node === self);
    const model = { ...a.model, dir: this.#o.modelDir ?? a.model.dir };
    const held = heldBy(a.plan, self);
    // A re-plan that leaves this stage's role as it was (same layers, same place in the chain, no experts
    // involved) keeps the loaded weights: only the requests of the old Plan are freed.
    const same = index >= 0 && held.size === 0 && remoteLayers(a.plan, index).length === 0 &&
      this.#kept !== undefined && this.#kept.key === JSON.stringify([roles[index], model]);
    let kept: StageBackend | undefined;
    if (this.#ref) {
      if (same) kept = this.#actor!.handOver();
      await this.#ref.stop(); // frees its requests, and its weights unless handed over
      this.#ref = this.#actor = undefined;
    }
    this.#kept = undefined;
    if (this.#hostRef) {
      await this.#hostRef.stop(); // frees its experts
      this.#hostRef = undefined;
      this.#host.registry.unregisterSet(EXPERT_PREFIX);
    }
    this.#local = undefined;
    // Experts the Plan gives this node: loaded first, and served by `moe-host-{node}` (its name resolving
    // is what tells the stages that use it that it is ready).
    let experts: ExpertService | undefined;
    if (held.size > 0) {
      if (!this.#o.expertLoader) {
        this.#log(`pipeline: the Plan gives this node experts, but it cannot hold any`);
      } else {
        try {
          experts = await this.#o.expertLoader(held, { model });
          if (this.#closed || a !== this.board.current) return experts.close();
          this.#hostRef = this.#host.actors.spawn(
            expertHostName(self),
            expertHostBehavior(experts, experts.hidden, this.#log),
          );
          // moe-expert-{layer}-{idx} resolves to this node for what it holds (one name set: ranges per layer).
          this.#host.registry.registerSet(EXPERT_PREFIX, expertSet(a.plan, self));
        } catch (e) {
          this.#log(`pipeline: cannot load this node's experts: ${(e as Error).message}`);
        }
      }
    }
    if (index < 0) return;
    const role = roles[index];
    this.#local = { planVersion: a.version, index, state: "loading" };
    const remote = remoteLayers(a.plan, index);
    const placement = expertPlacement(a.plan);
    const hostNodes = new Set(
      remote.flatMap((l) => [...(placement.get(l)?.keys() ?? [])]).filter((n) => n !== self),
    );
    const hosts = new Map([...hostNodes].map((n) => [n, new AbortController()]));
    this.#hosts = hosts;
    const membership = this.#host.membership;
    const alive = (n: string) => {
      const st = membership.member(n)?.state;
      return n === self || (st !== "dead" && st !== "left");
    };
    const loadStart = performance.now();
    try {
      const backend = kept ?? await this.#o.loader(role, {
        model,
        experts: remote.length
          ? {
            remote,
            fanout: createFanout({
              plan: a.plan,
              self,
              local: experts,
              call: async (name, body, node) => {
                const signal = hosts.get(node)?.signal;
                // A live host whose name does not resolve yet is still loading its experts (a replica taking
                // over right after a new Plan): wait for it rather than fail the step. Its death aborts the wait.
                if (alive(node)) {
                  await this.#host.registry.whenResolved(name, { timeoutMs: HOST_READY_MS, signal });
                }
                return this.#host.actors.call(name, body, { timeoutMs: 30_000, channel: "data", signal });
              },
              record: this.#fanout,
              alive,
              // Among replicas, the nearest by the measured round trip (unmeasured last, then the Plan's order).
              cost: (n) => this.#host.links?.of(self).get(n)?.rttMs ?? Number.MAX_VALUE,
              // A request's activations and sums cross to the hosts as its hops do (f16 unless --wire f32).
              wire: (id) => (id === undefined ? undefined : this.#actor?.wireOf(id)),
            }),
          }
          : undefined,
      });
      if (this.#closed || a !== this.board.current) return backend.close();
      if (!kept) {
        const s = ((performance.now() - loadStart) / 1e3).toFixed(1);
        this.#log(`stage ${index}: layers [${role.layers}] loaded in ${s} s`);
      }
      this.#actor = new StageActor({
        backend,
        planVersion: a.version,
        log: this.#log,
        send: (name, body) => this.#send(name, body, "data"),
        // Ready means: this stage can also resolve where its results go (the next stage, and stage 0
        // for the token loop); registry names arrive by gossip and may lag the leader's view.
        routesKnown: () =>
          [stageName(0), ...(index + 1 < a.plan.stages.length ? [stageName(index + 1)] : [])]
            .every((n) => this.#host.registry.resolve(n) !== undefined) &&
          // ...and every expert it sends has a host that answers (one live replica is enough).
          servable(a.plan, remote, (n) =>
            n === self
              ? experts !== undefined
              : alive(n) && this.#host.registry.resolve(expertHostName(n)) !== undefined),
        fanoutTrace: (id) => {
          const r = this.#fanout.get(id);
          if (!r) return undefined;
          this.#fanout.delete(id);
          return fanoutTrace(r);
        },
      });
      this.#ref = this.#host.actors.spawn(stageName(index), this.#actor);
      this.#local = { planVersion: a.version, index, state: "ready" };
      if (held.size === 0 && remote.length === 0) {
        this.#kept = { key: JSON.stringify([role, model]) };
      }
    } catch (e) {
      const error = (e as Error).message;
      this.#log(`stage ${index}: cannot load layers [${role.layers}]: ${error}`);
      this.#local = { planVersion: a.version, index, state: "failed", error };
      // Still answer STATS, so the leader learns why instead of waiting out its timeout.
      this.#ref = this.#host.actors.spawn(stageName(index), {
        receive: () => new TextEncoder().encode(JSON.stringify({ index, planVersion: a.version, error })),
      });
    }
  }

  #onMember({ member }: MemberChange): void {
    if (member.state !== "dead" && member.state !== "left") return;
    if (member.id === this.#host.membership.id) return;
    const why = member.state === "dead" ? "died (membership marked it dead)" : "left the cluster";
    this.client.peerGone(member.id, why, member.state === "dead" ? "died" : "left");
    // A node holding experts this stage sends to is gone: its calls fail now, not at their timeout (and the
    // fan-out sends its experts to a replica where there is one).
    const abort = this.#hosts.get(member.id);
    if (abort && !abort.signal.aborted) {
      abort.abort(new Error(`expert host ${member.id.slice(0, 10)} ${why}`));
    }
    if (!this.#actor) return;
    const inChain = this.board.current?.plan.stages.some((s) => s.node === member.id);
    const freed = inChain ? this.#actor.releaseAll() : this.#actor.releaseClientsOf(member.id);
    if (freed.length) this.#log(`node ${member.id.slice(0, 10)} ${why}: freed ${freed.length} request(s)`);
  }
}
