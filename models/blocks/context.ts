// What a block needs from the model while loading and while building a step's program: the GPU, how to
// read tensors onto it, and each weight buffer's storage. Blocks (attention, feed-forward) implement
// `load` and `program`; models/model.ts composes them into layers. One file per block kind.
import type {
  GemvFusedDims,
  Gpu,
  InputCopy,
  InputCopyOut,
  KvType,
  MoeInput,
  QuantType,
  WeightType,
} from "../../kernels/mod.ts";

/**
 * Reads tensors by name, concatenated row-wise, onto the GPU. `K` (a row length) marks a matrix, stored
 * as the model's weights are (quantised when asked and K allows); without K the tensor is a vector
 * (a norm or a bias), stored as `vector` says: the model's norm storage (default) or always f32.
 */
export type TensorReader = (names: string[], K?: number, vector?: "norm" | "f32") => Promise<GPUBuffer>;

export interface BlockContext {
  gpu: Gpu;
  /** Storage of the norm weights ("f32", or "f16" with f16 weights). */
  normType: WeightType;
  /** How a weight buffer is stored (a quantised model keeps some matrices in floats). */
  typeOf(buf: GPUBuffer): WeightType | QuantType;
  eps: number;
  /** Element type of the KV cache, GQA's K and V or MLA's latent rows (the model's kvType). */
  kv: KvType;
  /**
   * Whether the prefill GEMMs may multiply in f16 (kernels/gemm.ts gemmF16Math decides where they do): not
   * for models with MoE layers, whose top-k routing turns f16's roundings into other experts (H200:
   * mixtral-tiny's f16-weights logits error 3.0e-3 -> 9.2e-2). Blocks pass it as GemmDims.f16Math.
   */
  gemmF16: boolean;
  /**
   * Whether every one-token q4 GEMV takes the int8 direct mode, each reading the int8 copy of its input that
   * the kernel before wrote (GemvFusedDims.int8One): the dense blocks chain those copies round a layer. In
   * models with MoE layers only the GEMVs whose copy arrives take it (o_proj after the decode attention, the
   * next layer's qkv or the LM head after the fused expert kernel), as the MoE blocks make no other copies.
   */
  int8One: boolean;
  /** Uploads weights computed at load (e.g. a matrix cut into per-head blocks) as `as`, counted with the model's. */
  upload(data: Float32Array, as: WeightType, label: string): GPUBuffer;
  /**
   * Replaces a quantised stack of `matrices` [N, K] matrices, loaded row-major, by the same stack in column
   * blocks of C (kernels/convert.ts packColumnBlocksCall), freeing the original; the new buffer keeps its
   * storage type.
   */
  packColumns(buf: GPUBuffer, d: { matrices: number; N: number; K: number; C: number }): Promise<GPUBuffer>;
}

/** The step's shared buffers a block reads and writes ([maxChunk, width] f32 each). */
export interface StepBuffers {
  /** The step uniform (kernels/step.ts). */
  step: GPUBuffer;
  /** The residual stream [T, hidden]: blocks add their output into it. */
  x: GPUBuffer;
  /** Scratch for a normalised copy of x [T, hidden]. */
  xn: GPUBuffer;
}

/**
 * What the GEMVs of one step's program hand each other across block boundaries: an RMSNorm GEMV's input
 * copy, written by the GEMV before it (gemv_fused.ts normCopyFor: int8, or f32 in the f32 direct mode), so
 * the RMSNorm GEMV needs no input pass or no norm in its inner loop. Within a layer the attention's o_proj
 * writes the FFN's first GEMV's (`ffnInput`, `copy`); across layers the FFN's last GEMV writes the next
 * layer's qkv's or the LM head's (`after`, `afterCopy`), which arrives as the next layer's `input`. Each is
 * left unset where either side cannot.
 */
export interface LayerLink {
  /**
   * The FFN is a dense MLP: one-token attention may fold o_proj into its decode attention (models/blocks/gqa.ts;
   * before MoE blocks it measured no faster).
   */
  denseFfn?: boolean;
  /** The FFN's first GEMV (dense MLP: the paired gate/up), its dims and norm weights. */
  ffnInput?: { dims: GemvFusedDims; norm: GPUBuffer };
  /**
   * The FFN is a MoE block whose fused expert kernel reads its input from o_proj (kernels/moe_ffn.ts
   * moeInputFor): o_proj writes it, with the router's partial logits, where it can (moeInputCopy).
   */
  moeInput?: MoeInput;
  /** The copy of the FFN's input that o_proj wrote. */
  copy?: InputCopyOut;
  /** The RMSNorm GEMV after this layer's FFN: the next layer's qkv or the LM head. */
  after?: { dims: GemvFusedDims; norm: GPUBuffer };
  /** The copy of `after`'s input that the FFN's last GEMV wrote. */
  afterCopy?: InputCopyOut;
  /** The copy of this layer's attention input (its qkv's), written by the layer before. */
  input?: InputCopy;
}
