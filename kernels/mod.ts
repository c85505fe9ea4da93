// The WGSL kernels and the code that dispatches them. Each kernel file holds its WGSL, a builder for its
// dispatch (a KernelCall, built once and reused every step) and a plain CPU reference for its tests.
export * from "./gpu.ts";
export * from "./readback.ts";
export * from "./step.ts";
export * from "./embed.ts";
export * from "./rmsnorm.ts";
export * from "./matmul.ts";
export * from "./rope.ts";
export * from "./attention.ts";
export * from "./attention_decode.ts";
export * from "./silu_mul.ts";
export * from "./bias_add.ts";
export * from "./head_norm.ts";
export * from "./sample.ts";
export * from "./gemv_fused.ts";
export * from "./gemv_sg.ts";
export * from "./quant.ts";
export * from "./matmul_quant.ts";
export * from "./moe_router.ts";
export * from "./moe_gemv.ts";
export * from "./moe_grouped.ts";
export * from "./moe_ffn.ts";
export * from "./mla.ts";
export * from "./mla_attention.ts";
export * from "./convert.ts";
export * from "./moe_sg.ts";
