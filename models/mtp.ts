// Multi-token prediction (DeepSeek-V3, arXiv 2412.19437 §2.2) as a drafter for speculative decoding
// (`--draft mtp`, docs/SPECULATIVE.md). A checkpoint with `num_nextn_predict_layers` = D >= 1 stores D extra
// modules as layers numLayers .. numLayers + D - 1 (transformers ignores them). We run the first. Module 1
// predicts the token two ahead: at position t, from the target's last hidden state h_t (before the final
// norm) and the embedding of the token at t + 1,
//   h'  = eh_proj(concat(enorm(embed[token_{t+1}]), hnorm(h_t)))        [H]   (eh_proj [H, 2H])
//   out = the module's decoder layer on h' at position t                  [H]   (its own KV cache, by position)
//   d   = argmax(head(norm(out)))                                         the token at t + 2
// with the embedding shared with the target, and the head's norm and matrix the module's own (`shared_head`)
// where the checkpoint ships them, else the target's final norm and lm_head (SGLang always reads the target's
// lm_head and embedding). Drafting k tokens chains the module on its own output: out and the draft d take the
// places of h and the token at t + 1 (as SGLang and vLLM do with one module). (vLLM also zeroes the embedding
// at position 0; SGLang does not, nor do we.)
//
// The module runs on the target's GPU beside it and reads the target's hidden states where the last step left
// them (Engine.hiddenStates): after every target step of the single-node loop (the prefill's chunks, each
// verification) the loop calls `observe` with the rows it decided, and the module runs on them at once (its
// KV cache follows the target's positions; rejected positions are overwritten, as the target's are). Its
// greedy token for the position after the last decided one is sampled into its token buffer on the GPU, and
// the chained steps read it there: k drafts cost k small steps (k - 1 in one submit) and one readback. On a chain the hidden
// states are on the last stage, away from the drafter beside stage 0: `--draft mtp` runs on one node.
import { type Engine, submit } from "./engine.ts";
import { Checkpoint } from "./checkpoint.ts";
import { CheckpointError } from "./errors.ts";
import { Model, type Sequence } from "./model.ts";
import { layerPrefix, mtpTensors } from "./tensors.ts";
import type { Drafter } from "./speculative.ts";
import { advanceCall, type KernelCall, readBack, writeBytes, writeStep } from "../kernels/mod.ts";

/**
 * Loads the first MTP module of the checkpoint in `dir` beside `target` (the whole model, loaded from it),
 * in the target's weight storage. CheckpointError when the checkpoint ships none: no
 * num_nextn_predict_layers (or 0) in config.json, or the config names one but the weights lack it.
 */
export async function loadMtp(target: Engine, dir: string): Promise<Model> {
  const ckpt = await Checkpoint.open(dir);
  const c = ckpt.config;
  if (c.mtpLayers < 1) {
    const why = c.family === "deepseek_v3" ? "0 or absent" : `not read for the ${c.family} family`;
    throw new CheckpointError(
      `${dir} ships no multi-token-prediction module (config.json's num_nextn_predict_layers is ${why}): ` +
        `--draft mtp needs a DeepSeek-V3-style checkpoint that has one`,
    );
  }
  const missing = [
    ...mtpTensors(c, 0, { norm: false, head: false }).map(([n]) => n),
    layerPrefix(c.numLayers) + "input_layernorm.weight",
  ]
    .filter((n) => !ckpt.has(n));
  if (missing.length) {
    throw new CheckpointError(
      `${dir}: config.json says num_nextn_predict_layers = ${c.mtpLayers}, but the weights lack the module ` +
        `(missing ${missing.join(", ")}); conversions that drop layer ${c.numLayers} ship none`,
    );
  }
  return await Model.load(target.gpu, ckpt, { mtp: target.weights, weights: target.weights.weightType });
}

/** Drafts with the target's own MTP module, for one request of the single-node loop (speculativeGenerate). */
export class MtpDrafter implements Drafter {
  readonly kind = "mtp";
  #seq: Sequence | undefined;
  #request: string | undefined;
  #advance: KernelCall | undefined;
  /** The last position observed and its row in the module's `x` (where a chained step reads it). */
  #last: { pos: number; row: number } | undefined;

  constructor(readonly target: Engine, readonly module: Model, readonly opts: { maxSeq: number }) {
    if (!module.part.mtp) throw new TypeError("MtpDrafter needs a model loaded as an MTP module");
  }

  /**
   * The target decided positions pos0 .. pos0 + n - 1 (its last step's rows 0..n-1 hold their hidden states),
   * and `next` (n tokens) are the tokens that follow them. Runs the module on those rows now; its greedy
   * token for position pos0 + n + 1 is then on the GPU for `draft`.
   */
  observe(request: string, pos0: number, next: readonly number[]): Promise<void> {
    const { buffer, chunk } = this.target.hiddenStates(request);
    if (this.#request !== request) {
      this.#seq?.destroy();
      this.#advance = undefined;
      this.#seq = this.module.newSequence({
        maxSeq: this.opts.maxSeq,
        sampling: { temperature: 0, topP: 1, seed: 0 },
        maxChunk: chunk,
        hidden: buffer,
      });
      this.#request = request;
    }
    const seq = this.#seq!;
    const n = next.length;
    if (!(n >= 1 && n <= seq.maxChunk && pos0 + n <= seq.maxSeq)) {
      throw new RangeError(
        `MTP: ${n} rows at position ${pos0} do not fit steps of ${seq.maxChunk} in ${seq.maxSeq}`,
      );
    }
    const gpu = this.module.gpu;
    // The module's token buffer holds, at position p, the token that follows p: its input there.
    writeBytes(gpu, seq.tokens, pos0 * 4, Uint32Array.from(next));
    writeStep(gpu, seq.step, { pos0, T: n, tokOut: pos0 + n });
    submit(gpu, seq.program(n, "sample", { keys: pos0 + n }));
    this.#last = { pos: pos0 + n - 1, row: n - 1 };
    return Promise.resolve();
  }

  async draft(context: readonly number[], k: number): Promise<number[]> {
    const last = this.#last;
    if (k <= 0) return [];
    if (!last || context.length !== last.pos + 2) {
      throw new Error(
        `the MTP drafter drafts after the target step it observed (context of ${context.length} tokens, ` +
          `observed up to position ${last ? last.pos + 1 : "none"})`,
      );
    }
    const seq = this.#seq!, gpu = this.module.gpu;
    // Draft 1 is at tokens[last.pos + 1]; each chained step at position p writes tokens[p + 1]. The chained
    // steps go in one submit, the GPU moving the step record on between them (as the engine's decode loop).
    const n = Math.max(1, Math.min(k, seq.maxSeq - last.pos - 1));
    if (n > 1) {
      this.#advance ??= advanceCall(gpu, seq.step);
      const calls: KernelCall[] = [];
      // Chained step i is at position last.pos + i: it attends to last.pos + i + 1 keys.
      for (let i = 1; i < n; i++) {
        const hiddenRow = i === 1 ? last.row : 0;
        calls.push(...seq.program(1, "sample", { hiddenRow, keys: last.pos + i + 1 }), this.#advance);
      }
      writeStep(gpu, seq.step, { pos0: last.pos + 1, T: 1, tokOut: last.pos + 2 });
      submit(gpu, calls);
    }
    const ids = Array.from(new Uint32Array(await readBack(gpu, seq.tokens, n * 4, (last.pos + 1) * 4)));
    const V = this.module.config.vocabSize;
    if (ids.some((t) => t >= V)) throw new Error("the MTP module produced non-finite logits");
    return ids;
  }

  close(): void {
    this.#seq?.destroy();
    this.#seq = undefined;
  }
}
