/* The GPU placement's state, shared by its creation (exec_gpu.c) and its step (shards_gpu.c). */
#ifndef EXEC_GPU_INTERNAL_H
#define EXEC_GPU_INTERNAL_H

#include <math.h>

#include "exec/exec_gpu.h"
#include "exec/exec_internal.h"

/* A layer's device tensors. */
struct gpu_layer {
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv, *bo, *q_norm, *k_norm, *gate_inp_shexp;
    struct cuda_matrix wq, wk, wv, wo, ffn_gate, ffn_up, ffn_down, gate_inp, gate_shexp, up_shexp, down_shexp;
    struct cuda_moe moe;
};

struct gpu_tensor {
    const struct gguf_tensor *tensor;
    void *dev;
};

struct exec_gpu {
    struct cuda_ctx *cuda;
    cuda_stream stream; /* the compute stream: every kernel of a step, in order */
    struct cuda_arena arena;
    struct gpu_memory_report report;
    struct gpu_tensor *uploaded;
    uint32_t n_uploaded, cap_uploaded;
    struct gpu_layer *layers;
    struct cuda_matrix token_embd, output;
    const float *output_norm, *rope_freqs;
    struct cuda_attn_shape attn_shape;
    struct cuda_kv_layer *kv;
    /* device activations, sized for n_batch tokens */
    float *x, *xn, *proj, *q, *k, *v, *attn, *gate, *up, *router, *expert_weights, *rope_cs, *logits;
    int32_t *expert_ids, *tokens, *pos, *seq, *out_rows;
    void *work;
    size_t work_bytes;
    /* pinned host buffers: uploads of the batch, the logits coming back, weight staging */
    struct cuda_pinned host_in, host_logits, staging, host_x;
    /* The single-token, one-output step captured as a graph on first use and replayed after;
     * weight bytes it reads, counted at capture. */
    cuda_graph decode_graph;
    uint64_t decode_graph_bytes;
    bool no_graphs; /* PSHARD_NO_CUDA_GRAPHS set: launch kernel by kernel */
    bool capturing; /* enqueueing into a graph: arguments must hold for every replay */
};

#endif
