// swactor logits: teacher-forced logits of a token sequence, written as safetensors (for comparing
// with reference outputs).
import { wireFlag } from "./wire_flag.ts";
import type { Command } from "./command.ts";
import { expertsFlag, numberFlag, parseFlags, UsageError } from "./command.ts";
import { logitsLocal, prepareRequest, writeLogits } from "./pipeline_generate.ts";
import { checkOutputPath } from "./output_file.ts";
import {
  KV_HELP,
  loadModel,
  modelDirOrDemo,
  parseKv,
  parseTokenList,
  parseWeights,
  WEIGHTS_HELP,
} from "./load_model.ts";
import { clusterFlags, clusterHelp, logitsCluster } from "./cluster_cli.ts";

const USAGE = `Usage: swactor logits --model DIR --tokens 1,2,3 --out FILE.safetensors [options]

Writes the teacher-forced logits, float32 [T, vocab], as tensor "logits" (row t: the next-token logits
after tokens[0..t]), plus the tokens as int32 tensor "tokens".

Options:
  --model DIR           Hugging Face checkpoint folder (required)
  --tokens 1,2,3        the token ids (required)
  --out FILE            output .safetensors file (required; a regular file is replaced atomically,
                        a device or pipe such as /dev/stdout is written in place)
${WEIGHTS_HELP}
${KV_HELP}
  --local N             run on an ephemeral cluster of N node processes on this machine
  --wire f16|f32        activations between stages and to expert hosts with --local (default f32
                        here: exact)
  --experts local|spread  with --local: MoE experts on their layer's stage, or spread over the nodes
${clusterHelp(24)}
  -h, --help            this help`;

export const logitsCommand: Command = {
  name: "logits",
  summary: "write teacher-forced logits of token ids to a safetensors file",
  usage: USAGE,
  async run(argv) {
    const { values } = parseFlags(argv, {
      model: { type: "string" },
      tokens: { type: "string" },
      out: { type: "string" },
      weights: { type: "string" },
      kv: { type: "string" },
      local: { type: "string" },
      wire: { type: "string" },
      experts: { type: "string" },
      ...clusterFlags,
    });
    if (!values.model) throw new UsageError("--model DIR is required");
    if (!values.tokens) throw new UsageError("--tokens is required");
    if (!values.out) throw new UsageError("--out FILE is required");
    const tokens = parseTokenList(values.tokens);
    await checkOutputPath(values.out, "--out");
    const wire = wireFlag(values.wire) ?? "f32";
    const kv = parseKv(values.kv);
    if (values["cluster-plan"] !== undefined) throw new UsageError("--cluster-plan is `up`'s (the leader's)");
    if (values.cluster !== undefined) {
      return await logitsCluster(values, {
        ids: tokens,
        out: values.out,
        wire,
      }, values.model);
    }
    for (const f of ["emulate-wan", "memory-scale", "context"] as const) {
      if (values[f] !== undefined) throw new UsageError(`--${f} needs --cluster FILE`);
    }
    if (values.local !== undefined) {
      const n = numberFlag(values.local, "local", { min: 1, max: 64, integer: true, fallback: 1 });
      return await logitsLocal(n, {
        modelDir: values.model,
        weights: parseWeights(values.weights),
        kv,
        ids: tokens,
        out: values.out,
        wire,
        experts: expertsFlag(values.experts, values.local),
      });
    }
    const { checkpoint } = await prepareRequest({
      modelDir: await modelDirOrDemo(values.model),
      ids: tokens,
      tokenizer: false,
    });
    const { engine } = await loadModel(checkpoint, parseWeights(values.weights), kv);
    try {
      const logits = await engine.logits(tokens);
      const V = engine.model.vocab;
      await writeLogits(values.out, tokens, V, logits);
      console.error(`swactor: wrote logits [${tokens.length}, ${V}] to ${values.out}`);
      return 0;
    } finally {
      engine.close();
    }
  },
};
