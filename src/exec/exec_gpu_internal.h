/* The GPU placement's state, shared by its creation (exec_gpu.c) and its step (shards_gpu.c). */
#ifndef EXEC_GPU_INTERNAL_H
#define EXEC_GPU_INTERNAL_H

#include <math.h>

#include "exec/exec_gpu.h"
#include "exec/exec_internal.h"

/* A layer's device tensors. The matrices of a streamed shard point at its host memory, read
 * in place over PCIe (zero-copy); steps that stage it bind a copy of this to a slot instead. */
struct gpu_layer {
    const float *attn_norm, *ffn_norm, *bq, *bk, *bv, *bo, *q_norm, *k_norm, *gate_inp_shexp;
    struct cuda_matrix wq, wk, wv, wo, ffn_gate, ffn_up, ffn_down, gate_inp, gate_shexp, up_shexp, down_shexp;
    struct cuda_moe moe;      /* the resident experts [0, r): a VRAM copy of that range */
    struct cuda_moe moe_host; /* every expert, read in place from host memory */
    struct cuda_moe moe_all;  /* one call: every expert through tables of where it is,
                                 the resident ones in VRAM, the rest in host memory */
    const uint8_t *mask_resident;           /* [n_expert]: experts [0, r) */
    const uint8_t *mask_streamed[PLAN_TIERS]; /* [n_expert]: [r, experts_gpu) of the tier */
    const uint8_t *mask_gpu[PLAN_TIERS];      /* [n_expert]: [0, experts_gpu) of the tier */
    const uint8_t *mask_pieces;             /* [n_pieces][n_expert]: the staged pieces */
};

/* The batch as it goes up, rows of n_batch int32: tokens, positions, sequences, output rows, and
 * the multimodal rope's time, row and column positions (the batch's, else its positions). */
enum { GPU_BATCH_ROWS = 7 };

/* The logits' rows in VRAM: a step's outputs come down in chunks of at most this many. 16, or one
 * a sequence up to 64 where more sequences decode at once (a step of 64 decode tokens reads a
 * head the fused kernel takes once, not four times); at most n_batch. */
enum { GPU_LOGIT_ROWS = 16, GPU_LOGIT_ROWS_MAX = 64 };
static inline int32_t gpu_logit_rows(int32_t n_batch, int32_t n_seq) {
    const int32_t rows = n_seq < GPU_LOGIT_ROWS ? GPU_LOGIT_ROWS : n_seq < GPU_LOGIT_ROWS_MAX ? n_seq : GPU_LOGIT_ROWS_MAX;
    return n_batch < rows ? n_batch : rows;
}

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
    /* The KV block table ([n_seq][max_blocks], as ctx->kv.table) at a fixed place in the arena, so
     * a replayed graph reads the current one: copied up before a step whenever the host's changed
     * (table_version) through its pinned buffer; kv_marks: a step's blocks to carry up
     * (plan.kv_stream), [n_blocks]. */
    int32_t *kv_table;
    struct cuda_pinned host_table;
    uint64_t table_version;
    bool table_stale;
    bool *kv_marks;
    /* device activations, sized for n_batch tokens */
    float *x, *xn, *proj, *q, *k, *v, *attn, *gate, *up, *router, *expert_weights, *rope_cs, *logits;
    int32_t *expert_ids, *tokens, *pos, *seq, *out_rows, *rope_pos; /* the batch: GPU_BATCH_ROWS rows of n_batch */
    void *work;
    size_t work_bytes;
    /* pinned host buffers: uploads of the batch, the logits coming back, weight staging, the
     * residual stream crossing PCIe, and what the CPU's experts need and return */
    struct cuda_pinned host_in, host_logits, staging, host_x, host_xn, host_route, host_moe;
    int32_t host_logit_rows; /* host_logits' rows (exec_gpu_reserve_logits) */
    int32_t logit_rows;      /* logits' rows in VRAM (gpu_logit_rows) */
    /* ... the hand-offs' buffers as the GPU addresses them: its kernels write the input and the
     * routing there and read the CPU's sum from there in place, without copies */
    float *xn_to_host, *moe_from_host;
    int32_t *route_to_host;
    cuda_event route_ready; /* the routing of the current MoE shard has reached host_route */
    /* A one-token ring step's attention split with the CPU (plan_kv_cpu_cells): the cells
     * [0, kv_cpu_cells) the CPU attends in each carried layer (0: none this step), the token's
     * query coming down and the CPU's partial sums going up through host_attn ([n_head][head_k]
     * floats, then [n_head][head_v + 2]), and q_ready once the query is down. */
    int64_t kv_cpu_cells;
    struct cuda_pinned host_attn;
    cuda_event q_ready;
    bool unit_released; /* the current ring unit's slot was freed before its shard's end */
    /* A replayed decode step that splits MoE layers with the CPU meets the host at flags in
     * pinned host memory, two per layer: ready (the routing is down) and go (the CPU's sum is
     * in host_moe). */
    struct cuda_pinned flags;
    uint32_t *flags_dev;
    /* With plan_options.trace_handoffs: the GPU's clock at each flag, two per layer (raised, and
     * its wait for the host over), read back after each replayed step. */
    struct cuda_pinned stamps;
    uint64_t *stamps_dev;
    /* the model file's mappings, registered for streaming */
    struct cuda_pinned *registered;
    uint32_t n_registered;
    uint8_t *masks; /* device expert masks of every layer */
    /* A routed tier's one-token steps: each tier's quota on the device, and the mask of the
     * experts the GPU reads in place, rewritten from the routing layer by layer. */
    const uint8_t *routed_quota[PLAN_TIERS];
    uint8_t *routed_mask;
    /* the staging ring: slots in the arena, filled on the copy stream ahead of use */
    cuda_stream copy;
    uint8_t *slot[PLAN_STAGING_SLOTS];
    cuda_event filled[PLAN_STAGING_SLOTS], freed[PLAN_STAGING_SLOTS];
    bool slot_used[PLAN_STAGING_SLOTS];
    struct plan_unit *units; /* what the slots receive, in the order a ring step uses them */
    uint32_t n_units, next_fill, next_use;
    /* The ring step under way: its tier, and whether it passed over units it runs elsewhere
     * (a static tier's FFNs, on the CPU), which then are not in their slots. */
    const struct plan_tier *ring_tier;
    bool ring_passed;
    /* The plan's lent units are in their slots: a ring step ran to its end since the slots were
     * last overwritten, or they were copied there (plan.lent). */
    bool lent_ready;
    /* The single-token, one-output step (every shard on the GPU, experts possibly split with
     * the CPU) captured as a graph on first use and replayed after; the weight bytes the GPU
     * reads in it, counted at capture. */
    cuda_graph decode_graph;
    uint64_t decode_graph_bytes, decode_graph_streamed;
    bool capturing; /* enqueueing into a graph: arguments must hold for every replay */
    bool rope_ready; /* the step's rotation table is made (by its first attention on the GPU) */
    /* Two phases (plan.decode) or cells carried in the ring (plan.kv_stream): the host's KV cache,
     * registered so a change of phase or a ring step moves it at the speed of pinned copies; and
     * whether a change failed half way (the arena then holds neither plan: steps are refused). */
    struct cuda_pinned kv_host[2];
    bool broken;
    bool cells_down; /* a change of budget moved every cell to the host and freed the arena */
    bool lent_all;   /* the whole arena is lent (exec_gpu_lend_all), the plan to be carved again after */
    bool keep_mapped; /* the model file stays registered whatever the plan (exec_gpu_prepare_changes) */
    /* A rise of the budget carves the new plan at once and copies its resident matrices up on a
     * stream of their own while steps go on reading them in place from host memory (background);
     * each such matrix is pending: its view in place now, its device copy for later. Once the
     * copies are done (uploads_done, polled at each step's start), every pending matrix takes its
     * device copy, the expert tables are rewritten and the decode graph is captured again. */
    bool background;
    cuda_stream uploads;
    cuda_event uploads_done;
    struct pending_matrix { struct cuda_matrix *m; struct cuda_matrix dev; } *pending;
    uint32_t n_pending, cap_pending;
    double uploads_t0; /* when the change that started them was asked for (core_now_ms) */
    /* The sequences of the step under way, each once (plan.kv_stream: the ring copies their
     * cached cells); seen: [n_seq], false between steps. */
    int32_t *step_seq, n_step_seq;
    bool *seen;
};

/* At a step's start: a rise's resident matrices switched in where their copies are done (they are
 * read in place until then). */
pshard_status exec_gpu_take_uploads(struct exec_ctx *ctx);

/* host_logits with room for n tokens' logits, grown as exec_reserve_logits grows the CPU's (a
 * captured decode graph, which copies into the old buffer, is let go), or NOMEM and nothing
 * changed. Between steps only: the last step waited for its copies. */
pshard_status exec_gpu_reserve_logits(struct exec_ctx *ctx, int32_t n);

/* Between steps: both streams drained, the KV cells of the layers in VRAM copied to the host's
 * cache (which must exist; pinned first, once) and the plan the arena holds forgotten, its
 * allocation kept; steps are refused until exec_gpu_fill. A failure leaves the plan as it was. */
pshard_status exec_gpu_empty(struct exec_ctx *ctx);
/* The active plan carved into the emptied arena: its resident weights copied up, then the cells
 * of its layers in VRAM from the host's cache; steps run again. */
pshard_status exec_gpu_fill(struct exec_ctx *ctx);

/* A unit's layout in its slot (ring_fill copies it so): its n matrices of bytes[] one after
 * another, each aligned; where matrix m starts (m = n: the bytes the matrices take). */
static inline size_t unit_matrix_at(const size_t *bytes, int m) {
    size_t at = 0;
    for (int k = 0; k < m; k++) at += cuda_align(bytes[k]);
    return at;
}

/* A slot holding experts [first, end) of a layer as ring_fill copies them: for gate, up and down
 * the address expert 0 would have, so expert e of matrix m lies at base[m] + its bytes * e
 * (shards_gpu.c). */
void expert_slot_bases(const struct layer_weights *w, uint32_t first, uint32_t end, const uint8_t *slot,
                       uintptr_t base[3]);

#endif
