/* The CUDA backend as the rest of pshard sees it: plain C, no CUDA headers. Builds without
 * CUDA link src/cuda/none.c, where every function exists and fails with "no CUDA".
 *
 * Model of use (the executor): one cuda_ctx per device; one cuda_arena of exactly the budget,
 * from which resident weights, staging slots, the KV cache, activations, per-step scratch and
 * the cuBLAS workspace are all carved; nothing calls cudaMalloc after that. GPU work of a shard
 * is enqueued on the compute stream by the kernel functions below, which take device pointers
 * and return at once; weight copies go on the copy stream, ordered by events. Shapes and sizes
 * are host values (the executor knows them); per-token data (positions, sequence ids, routing)
 * lives on the device, so no kernel call needs to read device memory back. */
#ifndef CUDA_CUDA_BACKEND_H
#define CUDA_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/rope.h"
#include "quant/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Devices ---------------------------------------------------------------------------- */

struct cuda_device_info {
    char name[256];
    int compute_major, compute_minor;
    uint64_t total_bytes; /* device memory */
    uint64_t free_bytes;
    int driver_version, runtime_version;
};

/* Number of usable CUDA devices (0 when there is no driver, no GPU, or no CUDA in the build). */
int cuda_device_count(void);

pshard_status cuda_device_describe(int device, struct cuda_device_info *info);

/* The device's name and the driver's version only: no context is created (a context made
 * before cuda_ctx_create would hide part of its size from the measurement there). */
pshard_status cuda_device_identify(int device, char *name, size_t name_size, int *driver_version);

/* Free and total device memory of the current device, now. */
pshard_status cuda_device_memory(uint64_t *free_bytes, uint64_t *total_bytes);

/* ---- Context: a device, its two streams, cuBLAS ------------------------------------------- */

typedef struct cuda_stream_opaque *cuda_stream; /* a cudaStream_t */
typedef struct cuda_event_opaque *cuda_event;   /* a cudaEvent_t */

/* What creating the context cost in device memory. The context (and cuBLAS's handle) live
 * outside the arena; the budget accounts for them separately. */
struct cuda_ctx_info {
    char name[256];
    int sm_count;
    uint64_t l2_bytes, total_bytes;
    bool measured_before;         /* NVML gave the free memory before the context existed */
    uint64_t free_before_bytes;   /* NVML, before the CUDA context (0 if not measured) */
    uint64_t free_after_bytes;    /* cudaMemGetInfo right after the context was created */
    uint64_t context_bytes;       /* free_before - free_after; else total - free_after */
    uint64_t blas_bytes;          /* device memory cublasCreate took */
};

struct cuda_ctx;

/* Make `device` current, create its primary context, a compute and a copy stream (both
 * non-blocking) and a cuBLAS handle, measuring the memory each took. */
pshard_status cuda_ctx_create(int device, struct cuda_ctx **out);
void cuda_ctx_destroy(struct cuda_ctx *ctx);
const struct cuda_ctx_info *cuda_ctx_info(const struct cuda_ctx *ctx);
cuda_stream cuda_ctx_compute_stream(const struct cuda_ctx *ctx);
cuda_stream cuda_ctx_copy_stream(const struct cuda_ctx *ctx);

/* cuBLAS's workspace, carved from the arena (without it cuBLAS would cudaMalloc its own). */
enum { CUDA_BLAS_WORKSPACE_BYTES = 32 << 20 };
pshard_status cuda_ctx_set_blas_workspace(struct cuda_ctx *ctx, void *dev, size_t bytes);

/* Which kernel multiplies many tokens (n_tokens > CUDA_MATVEC_MAX_TOKENS): AUTO picks the one
 * measured faster on this class of GPU (bench/cuda_kernels.md). */
enum cuda_gemm_path { CUDA_GEMM_AUTO, CUDA_GEMM_FUSED, CUDA_GEMM_CUBLAS };
void cuda_ctx_set_gemm_path(struct cuda_ctx *ctx, enum cuda_gemm_path path);

/* ---- Device memory: one allocation, carved by a bump allocator ---------------------------- */

enum { CUDA_ARENA_ALIGN = 256, CUDA_ARENA_LOG = 128 };

/* bytes rounded up to CUDA_ARENA_ALIGN (what an arena allocation or a slot entry takes). */
static inline size_t cuda_align(size_t bytes) { return (bytes + CUDA_ARENA_ALIGN - 1) / CUDA_ARENA_ALIGN * CUDA_ARENA_ALIGN; }

struct cuda_arena_entry {
    size_t offset, bytes;
    const char *what; /* a static string naming the use ("kv", "weights", "scratch") */
};

struct cuda_arena {
    uint8_t *base; /* device memory */
    size_t size, used, peak;
    size_t n_allocs, n_log;
    struct cuda_arena_entry log[CUDA_ARENA_LOG]; /* the first CUDA_ARENA_LOG live allocations */
};

/* One cudaMalloc of exactly `bytes` on the current device. */
pshard_status cuda_arena_create(struct cuda_arena *a, size_t bytes);
void cuda_arena_destroy(struct cuda_arena *a);

/* `bytes` rounded up to CUDA_ARENA_ALIGN; fails (PSHARD_ERR_NOMEM, naming `what`) when full. */
pshard_status cuda_arena_alloc(struct cuda_arena *a, size_t bytes, const char *what, void **out);

/* Per-step scratch: take a mark, allocate, reset to the mark. */
size_t cuda_arena_mark(const struct cuda_arena *a);
void cuda_arena_reset(struct cuda_arena *a, size_t mark);

/* A human-readable summary: size, used, peak, and the live allocations summed by `what`.
 * Returns the length written (snprintf semantics). */
int cuda_arena_report(const struct cuda_arena *a, char *buf, size_t len);

/* ---- Streams, events, copies -------------------------------------------------------------- */

pshard_status cuda_stream_create(cuda_stream *out);
void cuda_stream_destroy(cuda_stream s);
pshard_status cuda_stream_sync(cuda_stream s);

/* timing = false makes the lighter event that ordering needs. */
pshard_status cuda_event_create(bool timing, cuda_event *out);
void cuda_event_destroy(cuda_event e);
pshard_status cuda_event_record(cuda_event e, cuda_stream s);
/* Work enqueued on s after this call waits for e (no host block). */
pshard_status cuda_stream_wait(cuda_stream s, cuda_event e);
pshard_status cuda_event_sync(cuda_event e);
pshard_status cuda_event_done(cuda_event e, bool *done);
pshard_status cuda_event_elapsed_ms(cuda_event start, cuda_event end, float *ms);

/* Asynchronous copies on s. Host memory should be pinned (below) or the copy is slow and
 * synchronous with the host. */
pshard_status cuda_copy_h2d(void *dst_dev, const void *src_host, size_t bytes, cuda_stream s);
pshard_status cuda_copy_d2h(void *dst_host, const void *src_dev, size_t bytes, cuda_stream s);
pshard_status cuda_copy_d2d(void *dst_dev, const void *src_dev, size_t bytes, cuda_stream s);
pshard_status cuda_memset(void *dst_dev, int value, size_t bytes, cuda_stream s);

/* Capture the work enqueued on s between begin and end into a graph, replayed with one launch
 * (a decode step is hundreds of small kernels; a graph removes their launch gaps). Kernel
 * arguments are frozen at capture: what changes per replay must live in device memory or in
 * pinned host buffers the captured copies read. */
typedef struct cuda_graph_opaque *cuda_graph; /* a cudaGraphExec_t */
pshard_status cuda_graph_capture_begin(cuda_stream s);
pshard_status cuda_graph_capture_end(cuda_stream s, cuda_graph *out);
pshard_status cuda_graph_launch(cuda_graph g, cuda_stream s);
void cuda_graph_destroy(cuda_graph g);

/* Hand-offs inside a replayed graph: a graph that needs the host part way through (the CPU's
 * experts of a split MoE layer) meets it at flags in pinned host memory (device addresses of
 * cuda_host_alloc memory, from cuda_host_device_pointer). The GPU raises a flag once what the
 * host needs has been copied down; it waits, one thread polling, until the host raises another,
 * and lowers that one again for the next replay. The host's side is cuda_flag_* below. With a
 * stamp (cuda_stamps_alloc; NULL: none), the GPU writes its clock (ns) there as it raises, or as
 * its wait ends: where a replayed step's time goes on the GPU side (plan_options.trace_handoffs). */
pshard_status cuda_flag_raise(uint32_t *flag_dev, uint64_t *stamp_dev, cuda_stream s);
pshard_status cuda_flag_wait(uint32_t *flag_dev, uint64_t *stamp_dev, cuda_stream s);
/* The host's side: wait until the GPU raised `flag` (polling; a failed stream ends the wait with
 * its error), then lower it; raise one for the GPU after the data it will read is written. */
pshard_status cuda_flag_host_wait(volatile uint32_t *flag, cuda_stream s);
void cuda_flag_host_raise(volatile uint32_t *flag);

/* ---- Pinned host memory ------------------------------------------------------------------- */

struct cuda_pinned {
    void *ptr;       /* what the caller asked for */
    size_t bytes;
    void *base;      /* page-aligned range actually registered / allocated */
    size_t base_bytes;
    bool pinned;     /* false: registration failed and the range stayed pageable */
    bool allocated;  /* from cuda_host_alloc */
    bool read_only;  /* registered with cudaHostRegisterReadOnly */
};

/* Pin an existing range (e.g. part of an mmapped file), widened to whole pages. Tries a
 * read-only registration first (needed for PROT_READ mappings), then a plain one. When both
 * fail: with `required`, an error saying why and what it costs; without, PSHARD_OK with
 * pinned = false (the caller may copy from pageable memory at a fifth of the speed).
 * Registered with cudaHostRegisterMapped, so kernels can also read the range in place
 * (cuda_host_device_pointer). */
pshard_status cuda_host_register(void *ptr, size_t bytes, bool required, struct cuda_pinned *out);
/* Pin an existing range that copies from the device write into (read-write only), widened to
 * whole pages; where that fails, PSHARD_OK with pinned = false (copies then run pageable). */
pshard_status cuda_host_register_writable(void *ptr, size_t bytes, struct cuda_pinned *out);
/* The address kernels read a pinned or registered host byte through (zero-copy: each read
 * crosses PCIe, so a kernel that reads its weights once streams them at close to copy speed). */
pshard_status cuda_host_device_pointer(const void *host, const void **dev);
/* Fresh pinned memory (cudaMallocHost). */
pshard_status cuda_host_alloc(size_t bytes, struct cuda_pinned *out);
/* n hand-off flags (cuda_flag_*), lowered: pinned memory and the address the GPU uses. */
pshard_status cuda_flags_alloc(size_t n, struct cuda_pinned *out, uint32_t **dev);
/* n clock stamps for cuda_flag_raise/wait, zeroed: pinned memory and the address the GPU uses. */
pshard_status cuda_stamps_alloc(size_t n, struct cuda_pinned *out, uint64_t **dev);
/* Unregister or free, whichever applies; safe on a zeroed struct. */
void cuda_pinned_release(struct cuda_pinned *p);

/* ---- Weights and activations ---------------------------------------------------------------- */

/* A weight matrix in device memory: n_rows rows of n_cols elements of `type`, rows row_bytes
 * apart, in GGUF's block layout. For a 3-D expert tensor, n_experts matrices follow each other
 * and `data` is expert 0. */
struct cuda_matrix {
    enum quant_type type;
    const void *data;
    int64_t n_cols, n_rows, n_experts;
    size_t row_bytes;
    bool in_place; /* data is registered host memory, read over PCIe (a streamed matrix) */
};

/* Whether the kernels compute with `type` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
 * Q2_K..Q6_K); rows must also have a multiple of 32 elements. */
bool cuda_type_supported(enum quant_type type);

/* Format of the activations cuda_matvec wants for weights of `type`: Q8_1 for the 32-element
 * formats (its d and quants are those of Q8_0, byte for byte, but 4-byte aligned, so the
 * Q8_0-based dots read them directly and compute exactly the CPU's integers), Q8_K for the K
 * formats, F16/BF16/F32 for the float formats. */
enum quant_type cuda_act_type(enum quant_type weight_type);
size_t cuda_act_row_bytes(enum quant_type act_type, int64_t n_cols);

/* x [n_rows][n_cols] f32 -> out [n_rows][cuda_act_row_bytes(act_type)], act_type one of F32,
 * F16, BF16, Q8_0, Q8_1, Q8_K, byte-identical to quant_act_*_ref. */
pshard_status cuda_quantize(enum quant_type act_type, const float *x, int64_t n_cols, int64_t n_rows, void *out,
                            cuda_stream s);

/* Most tokens one pass of the matrix-vector kernel takes (more run as passes side by side). */
enum { CUDA_MATVEC_MAX_TOKENS = 8 };

/* y[t][r] (y_stride floats per token) = row r of m . token t of acts, for n_tokens token rows
 * quantized by cuda_quantize(cuda_act_type(m->type)), in passes of up to 8 tokens in one launch.
 * Bandwidth-bound: every weight byte is read once per pass. */
pshard_status cuda_matvec(const struct cuda_matrix *m, const void *acts, int n_tokens, float *y, int64_t y_stride,
                          cuda_stream s);

/* The same for `count` matrices (at most CUDA_MATVEC_MAX_PARTS) of one type and width in one
 * launch, from the same activations: y[i] [n_tokens][m[i]->n_rows] = (or, with accumulate, +=)
 * m[i] . acts (q, k and v; gate and up). */
enum { CUDA_MATVEC_MAX_PARTS = 4 };
pshard_status cuda_matvec_each(const struct cuda_matrix *const *m, int count, const void *acts, int n_tokens,
                               float *const *y, bool accumulate, cuda_stream s);

/* y = x . m^T for any n_tokens: quantize + matvec up to 8 tokens, else the f16 tensor-core path
 * (the fused dequantizing kernel, or dequantization into `work` + cuBLAS; F16 weights marked
 * in_place are copied into `work` the same way first). F32 weights (MoE routers) take the
 * matrix-vector kernel at any count, reading x as it is: f32 sums, each token's the same
 * whatever the step's size, so routing does not flip near a tie between prompt and decode. `work` holds at least
 * cuda_matmul_work_bytes(m, n_tokens); more lets the cuBLAS path take more rows per call. */
size_t cuda_matmul_work_bytes(const struct cuda_matrix *m, int64_t n_tokens);
pshard_status cuda_matmul(struct cuda_ctx *ctx, const struct cuda_matrix *m, const float *x, int64_t n_tokens,
                          float *y, int64_t y_stride, void *work, size_t work_bytes, cuda_stream s);

/* Whether cuda_matmul reads m's bytes once for all of n_tokens tokens (more than 8) on the fused
 * kernel, as it does for a tall block-format matrix in VRAM (a head) and up to 64 tokens, rather
 * than an f16 copy of them made for the call: its caller then need not cut the tokens into
 * matrix-vector passes of 8, each reading the matrix. */
bool cuda_matmul_reads_once(const struct cuda_ctx *ctx, const struct cuda_matrix *m, int64_t n_tokens);

/* y [n_tokens][m->n_rows] += x . m^T (the residual stream takes a projection): up to 8 tokens the
 * matrix-vector kernel adds into y itself; above, cuda_matmul into tmp ([n_tokens][m->n_rows])
 * and an add, the same sums either way. */
pshard_status cuda_matmul_add(struct cuda_ctx *ctx, const struct cuda_matrix *m, const float *x, int64_t n_tokens,
                              float *y, float *tmp, void *work, size_t work_bytes, cuda_stream s);

/* Rows [row0, row0 + n_rows) of m as f16 (out [n_rows][n_cols]). */
pshard_status cuda_dequantize_f16(const struct cuda_matrix *m, int64_t row0, int64_t n_rows, uint16_t *out,
                                  cuda_stream s);

/* Embedding lookup: out[i] = row rows[i] of m, dequantized to f32 exactly as the CPU does. */
pshard_status cuda_get_rows(const struct cuda_matrix *m, const int32_t *rows, int64_t n, float *out, cuda_stream s);

/* ---- Element-wise operators (f32 row-major activations) ---------------------------------- */

/* out = x / rms(x) * w per row of n (w may be NULL); for q/k norms pass heads as rows. */
pshard_status cuda_rmsnorm(const float *x, const float *w, float *out, int64_t n_rows, int64_t n, float eps,
                           cuda_stream s);
/* The same, also writing out to `mirror` (host memory the GPU writes in place, or NULL), there
 * before anything the stream signals after it. */
pshard_status cuda_rmsnorm_mirror(const float *x, const float *w, float *out, float *mirror, int64_t n_rows, int64_t n,
                                  float eps, cuda_stream s);
/* Whether the kernels below that end in a product's activations (RMSNorm, SwiGLU, decode
 * attention's merge) write them in `act_type` in the same launch: Q8_0, Q8_1, F16 and BF16. */
bool cuda_writes_act(enum quant_type act_type);
/* cuda_rmsnorm_mirror (out not x; mirror may be NULL), and out quantized to act_type into q as
 * cuda_quantize does, all to the bit; one launch where cuda_writes_act(act_type) and n is a
 * multiple of 32, over a block per 256 values (each summing its row's squares), else the two
 * calls. */
pshard_status cuda_rmsnorm_quantize(enum quant_type act_type, const float *x, const float *w, float *out, float *mirror,
                                    void *q, int64_t n_rows, int64_t n, float eps, cuda_stream s);
pshard_status cuda_add(float *acc, const float *x, int64_t n, cuda_stream s);
pshard_status cuda_add_bias(float *x, const float *bias, int64_t n_rows, int64_t n, cuda_stream s);
/* out[i] = silu(gate[i]) * up[i] (out may be gate). */
pshard_status cuda_swiglu(const float *gate, const float *up, float *out, int64_t n, cuda_stream s);
/* The same for n_rows rows of n_cols written as cuda_quantize(act_type) would write them into q
 * (no f32 copy), in one launch: cuda_writes_act(act_type), n_cols a multiple of 32. */
pshard_status cuda_swiglu_quantize(enum quant_type act_type, const float *gate, const float *up, int64_t n_cols,
                                   int64_t n_rows, void *q, cuda_stream s);

/* RoPE as src/cpu/rope.c: cs [n_tokens][p->n_dims] from device positions; p->freq_factors is
 * ignored (a host pointer): pass the device copy as freq_factors (or NULL). With multimodal rope
 * (p->sections) token t's time, row and column are pos[t], pos[t + pos_stride] and
 * pos[t + 2 * pos_stride]; else pos_stride is not used. */
pshard_status cuda_rope_table(const struct rope_params *p, const float *freq_factors, const int32_t *pos,
                              int64_t pos_stride, int64_t n_tokens, float *cs, cuda_stream s);
/* Rotate x [n_tokens][n_heads * head_size] in place with cs [n_tokens][n_dims]. */
pshard_status cuda_rope_apply(const struct rope_params *p, const float *cs, float *x, int64_t n_tokens, int n_heads,
                              int head_size, cuda_stream s);
/* Per head of x [n_tokens][n_heads][head_size]: RMSNorm (weights w [head_size]) and then the
 * rotation, in one kernel, with the results of cuda_rmsnorm and cuda_rope_apply to the bit. */
pshard_status cuda_norm_rope(const struct rope_params *p, const float *cs, float *x, const float *w, float eps,
                             int64_t n_tokens, int n_heads, int head_size, cuda_stream s);
struct cuda_kv_layer;
/* cuda_norm_rope of a layer's q [n_tokens][n_head][head_size] (weights q_norm) and k
 * [n_tokens][n_head_kv][head_size] (k_norm), then k's heads and v's (heads of head_v) rounded to
 * f16 into the cache at cell pos[t] of sequence seq[t], as cuda_kv_store writes them: all in one
 * launch. */
pshard_status cuda_norm_rope_qk_store(const struct rope_params *p, const float *cs, float *q, const float *q_norm,
                                      int n_head, float *k, const float *k_norm, int n_head_kv, float eps, int64_t n_tokens,
                                      int head_size, const struct cuda_kv_layer *kv, const float *v, int head_v,
                                      const int32_t *seq, const int32_t *pos, cuda_stream s);
/* The same without the norms: cuda_rope_apply of q and of k, then cuda_kv_store, in one launch. */
pshard_status cuda_rope_qk_store(const struct rope_params *p, const float *cs, float *q, int n_head, float *k,
                                 int n_head_kv, int64_t n_tokens, int head_size, const struct cuda_kv_layer *kv,
                                 const float *v, int head_v, const int32_t *seq, const int32_t *pos, cuda_stream s);

/* ---- KV cache and attention ------------------------------------------------------------------ */

/* One layer's f16 cache, a pool of blocks as src/exec/kv_cache.h lays it out: rows of n_head_kv *
 * head_k values (v: head_v), block_cells rows a block. Sequence s's cell at position p is row
 * blocks[s * blocks_stride + p / block_cells] * block_cells + p % block_cells; the table lives in
 * device memory (blocks_stride 0: every sequence reads the first row of the table). block_cells
 * is a multiple of CUDA_KV_TILE, so a prompt kernel's tile of cells is one lookup. */
enum { CUDA_KV_TILE = 64 };
struct cuda_kv_layer {
    uint16_t *k, *v;
    const int32_t *blocks;
    int32_t blocks_stride, block_cells;
};

/* Round k [n_tokens][n_head_kv*head_k] and v to f16 into cell pos[t] of sequence seq[t] (whose
 * block the caller took for it). */
pshard_status cuda_kv_store(const struct cuda_kv_layer *kv, const float *k, const float *v, int64_t k_width,
                            int64_t v_width, const int32_t *seq, const int32_t *pos, int64_t n_tokens, cuda_stream s);

struct cuda_attn_shape {
    int n_head, n_head_kv, head_k, head_v;
    float scale;
};

/* Causal attention, token t over cells [0, pos[t]] of sequence seq[t]: q [n_tokens][n_head *
 * head_k] f32 (rounded to f16 like the CPU), out [n_tokens][n_head * head_v]. Split over the KV
 * length (flash-decoding); max_kv_len bounds pos[t] + 1 and sizes the split. Any batch. */
size_t cuda_attention_decode_work_bytes(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len);
pshard_status cuda_attention_decode(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv, const float *q,
                                    const int32_t *seq, const int32_t *pos, int64_t n_tokens, int32_t max_kv_len,
                                    float *out, void *work, size_t work_bytes, cuda_stream s);
/* The same, out also quantized to q_type into q_out in the same launch as cuda_quantize would
 * (for the product after it), where cuda_attention_decode_quantizes: cuda_writes_act(q_type),
 * heads of a multiple of 32 values up to 128. */
bool cuda_attention_decode_quantizes(const struct cuda_attn_shape *a, enum quant_type q_type);
pshard_status cuda_attention_decode_quantized(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv,
                                              const float *q, const int32_t *seq, const int32_t *pos, int64_t n_tokens,
                                              int32_t max_kv_len, float *out, enum quant_type q_type, void *q_out,
                                              void *work, size_t work_bytes, cuda_stream s);

/* A decode step's attention split with the host: here each token attends cells [first, pos[t]]
 * only (first < max_kv_len; a token with no such cell leaves empty sums), and the host attends
 * cells [0, first) and leaves its partial sums -- for each token and query head its maximum
 * score, its sum of exponentials and its unnormalized output, [n_tokens][n_head][head_v + 2]
 * floats (cpu_attention_merge_sums) -- at cuda_attention_host_sums in work; then
 * cuda_attention_merge_host merges both into out (and q_out, as cuda_attention_decode_quantized).
 * The three calls take the same step, bound and first; work holds
 * cuda_attention_split_work_bytes. */
size_t cuda_attention_split_work_bytes(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len, int32_t first);
float *cuda_attention_host_sums(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len, int32_t first,
                                void *work);
pshard_status cuda_attention_decode_from(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv, const float *q,
                                         const int32_t *seq, const int32_t *pos, int64_t n_tokens, int32_t max_kv_len,
                                         int32_t first, void *work, size_t work_bytes, cuda_stream s);
pshard_status cuda_attention_merge_host(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len, int32_t first,
                                        float *out, enum quant_type q_type, void *q_out, void *work, cuda_stream s);

/* The same for many tokens of one sequence (a prompt), on tensor cores: tiles of 64 queries x
 * 64 cells, f16 products with f32 accumulation and online softmax; head_k, head_v multiples of
 * 16 up to 128. Probabilities are rounded to f16 for the P.V product. Where a step's query
 * tiles and heads are too few blocks to fill the GPU, the cache (max_kv_len bounds pos[t] + 1)
 * is split into slices of 512 cells or more, merged as the decode kernel's are, in `work`:
 * cuda_attention_prefill_work_bytes for every step of up to n_tokens over up to max_kv_len
 * cells (0 where none splits); work NULL: never split. */
enum { CUDA_PREFILL_Q_ROWS = 64, CUDA_PREFILL_MAX_HEAD = 128 }; /* a tile's queries; the widest head */
/* These three are rules of shape alone, the same in a build without CUDA: the planner prices a
 * GPU profile's attention there as a CUDA build runs it. */
static inline bool cuda_attention_prefill_supported(const struct cuda_attn_shape *a) {
    return a->n_head_kv > 0 && a->n_head % a->n_head_kv == 0 && a->head_k % 16 == 0 && a->head_v % 16 == 0 &&
           a->head_k <= CUDA_PREFILL_MAX_HEAD && a->head_v <= CUDA_PREFILL_MAX_HEAD;
}
/* The fewest tokens of one sequence that take the prompt kernel (0: never): 2 tokens per query
 * head a KV head serves (its group), 8 at the least, a full tile of queries at the most. Below a
 * tile a block costs what a full tile's does; the decode kernel reads the cache once per token
 * (once for a KV head's group), so it pays for fewer tokens the smaller the group. Measured,
 * the prompt kernel wins from 8 tokens over long caches, and the decode kernel over short ones
 * up to the bound above (bench/cuda_kernels.md). */
static inline int64_t cuda_attention_prefill_from(const struct cuda_attn_shape *a) {
    if (!cuda_attention_prefill_supported(a)) return 0;
    const int64_t group = a->n_head / a->n_head_kv, from = 2 * group > 8 ? 2 * group : 8;
    return from < CUDA_PREFILL_Q_ROWS ? from : CUDA_PREFILL_Q_ROWS;
}
/* Whether n tokens of one sequence should take the prompt kernel. */
static inline bool cuda_attention_prefill_pays(const struct cuda_attn_shape *a, int64_t n_tokens) {
    const int64_t from = cuda_attention_prefill_from(a);
    return from > 0 && n_tokens >= from;
}
size_t cuda_attention_prefill_work_bytes(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len);
pshard_status cuda_attention_prefill(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv, const float *q,
                                     int32_t seq, const int32_t *pos, int64_t n_tokens, int32_t max_kv_len, float *out,
                                     void *work, size_t work_bytes, cuda_stream s);

/* ---- Mixture of experts ---------------------------------------------------------------------- */

/* As cpu_moe_route: per token softmax over n_expert logits, top k (ties: lower index), weights
 * renormalized to sum 1 when `normalize`. ids/weights [n_tokens][k] on the device. */
pshard_status cuda_moe_route(const float *logits, int64_t n_tokens, int n_expert, int k, bool normalize, int32_t *ids,
                             float *weights, cuda_stream s);
/* The same, also writing ids and then weights to `mirror` ([n_tokens * k] ids, then as many
 * weights: host memory the GPU writes in place, or NULL), there before anything the stream
 * signals after it. */
pshard_status cuda_moe_route_mirror(const float *logits, int64_t n_tokens, int n_expert, int k, bool normalize,
                                    int32_t *ids, float *weights, int32_t *mirror, cuda_stream s);

/* One token's split by routing (plan_routed_split): mask [n_expert] = 1 for the experts of
 * ids [k] the GPU reads in place, the first quota[N] in routing order of the N from `first` on
 * (quota [k + 1] on the device), and with resident_too for its experts below `first`; 0
 * elsewhere. */
pshard_status cuda_moe_routed_mask(const int32_t *ids, int k, int first, const uint8_t *quota, int n_expert,
                                   bool resident_too, uint8_t *mask, cuda_stream s);

struct cuda_moe {
    struct cuda_matrix gate, up, down; /* 3-D expert tensors: [n_expert][rows][row_bytes] */
    int n_expert, k;
    /* Optional [n_expert] device tables of each expert's matrix (e.g. staging slots), used
     * instead of the 3-D layout; rows must then be 16-byte aligned when row_bytes is. */
    const void *const *gate_ptrs, *const *up_ptrs, *const *down_ptrs;
    /* Optional [n_expert] device mask: only experts with a nonzero entry are computed here;
     * the others' contributions are left out (for the caller to add from elsewhere). */
    const uint8_t *expert_mask;
    /* Steps of up to this many tokens run the expert groups on the matrix-vector kernel, more
     * on the tiled GEMM (0: cuda_moe_matvec_bound's rule; benchmarks and tests set others). */
    int matvec_max_tokens;
    /* A step of more tokens runs in slices of up to this many, one after another over the same
     * work buffer, so the buffer is a slice's whatever the micro-batch (0: CUDA_MOE_SLICE_TOKENS;
     * tests set others). Each slice reads its experts' weights again. */
    int slice_tokens;
};

/* The default slice: 2,048 tokens, 16,384 pairs of a top-8 layer, past which the tiled GEMM's
 * tiles are full and a larger step only grows the work buffer (qwen235b's: 512 MB a slice). */
enum { CUDA_MOE_SLICE_TOKENS = 2048 };

/* Steps of up to this many tokens on the matrix-vector kernel run the fused kernels (gate/up with
 * SwiGLU in one launch, down with the weighted sum in another) where the formats allow: gate and
 * up of one type, rows a multiple of 4 bytes. Above, the fused down (each token's experts read
 * apart) falls behind the expert groups (bench/cuda_kernels.md: 5 tokens of qwen30b's layer). */
enum { CUDA_MOE_FUSED_MAX_TOKENS = 4 };

/* Most tokens a step of an MoE layer (top k of n_expert) whose expert groups run on the
 * matrix-vector kernel, in passes of up to CUDA_MATVEC_MAX_TOKENS pairs an expert: while its
 * experts take CUDA_MOE_MATVEC_PAIRS pairs each on average, or it has no more tokens than one
 * pass takes; above, the tiled GEMM. The bound is where the matrix-vector kernel stopped being the
 * faster, from VRAM and reading experts in place alike (bench/cuda_kernels.md); the profile
 * times in-place reads with the kernel every call of that size runs. */
enum { CUDA_MOE_MATVEC_PAIRS = 8 };
static inline int64_t cuda_moe_matvec_max_tokens(int64_t n_expert, int64_t k) {
    const int64_t by_pairs = k > 0 ? CUDA_MOE_MATVEC_PAIRS * n_expert / k : 0;
    return by_pairs > CUDA_MATVEC_MAX_TOKENS ? by_pairs : CUDA_MATVEC_MAX_TOKENS;
}

/* Whether this device multiplies expert matrices of this format on int8 tensor cores in the tiled
 * path (Q4_0, Q2_K, Q4_K or Q5_K rows of whole 256-element stages, the kernel compiled for sm_80
 * or later), its activations in cuda_act_type's format, rather than dequantizing them to f16. */
bool cuda_int8_products(enum quant_type type, int64_t n_cols);
/* With that kernel, from VRAM, the tiled path is the faster from 9 tokens of qwen30b's layer on
 * (bench/cuda_kernels.md: 113 against 118 us at 8 tokens, 149 against 176 at 16): steps of up to
 * this many stay on the matrix-vector kernel. Experts read in place keep the bound above. */
enum { CUDA_MOE_INT8_MATVEC_MAX = 8 };

/* The most tokens a step of m runs its expert groups on the matrix-vector kernel for: the
 * caller's matvec_max_tokens, else CUDA_MOE_INT8_MATVEC_MAX where the gate's experts are in VRAM
 * and multiply on int8 tensor cores, else cuda_moe_matvec_max_tokens. */
int64_t cuda_moe_matvec_bound(const struct cuda_moe *m);

/* out [n_tokens][n_embd] (=, or += with accumulate) sum_j w[t][j] * down_e(silu(gate_e(x)) *
 * up_e(x)), e = ids[t][j], over the experts computed here. Tokens are grouped by expert on the
 * GPU, so each chosen expert's weights are read once per step, or per slice of a step larger
 * than a slice (small steps on the fused kernels: gate and up once, down once per token that
 * chose the expert). */
size_t cuda_moe_work_bytes(const struct cuda_moe *m, int64_t n_tokens);
pshard_status cuda_moe_ffn(const struct cuda_moe *m, const float *x, const int32_t *ids, const float *weights,
                           int64_t n_tokens, float *out, bool accumulate, void *work, size_t work_bytes,
                           cuda_stream s);
/* The same with x also given quantized as cuda_quantize(cuda_act_type(m->gate.type), x, ...) would
 * (x_act; NULL: quantized here), as cuda_rmsnorm_quantize leaves it: steps of matrix-vector sizes
 * read it instead of quantizing x again, once per call. */
pshard_status cuda_moe_ffn_quantized(const struct cuda_moe *m, const float *x, const void *x_act, const int32_t *ids,
                                     const float *weights, int64_t n_tokens, float *out, bool accumulate, void *work,
                                     size_t work_bytes, cuda_stream s);
/* Whether cuda_moe_ffn runs a step of n_tokens on the fused kernels. */
bool cuda_moe_fuses(const struct cuda_moe *m, int64_t n_tokens);
/* cuda_moe_ffn on the grouped kernels even where it would fuse (tests and benchmarks compare). */
pshard_status cuda_moe_ffn_grouped(const struct cuda_moe *m, const float *x, const int32_t *ids, const float *weights,
                                   int64_t n_tokens, float *out, bool accumulate, void *work, size_t work_bytes,
                                   cuda_stream s);

/* ---- Vision encoder (Qwen2.5-VL): what the language model's kernels above do not cover ------ */

/* Device memory lent for a while (the executor's scratch between steps, to the vision encoder). */
struct cuda_region {
    uint8_t *base;
    size_t bytes;
};

/* Rows [q_first, q_first + q_count) of the queries attend over rows [k_first, k_first + k_count)
 * of the keys: one window's patches (or part of them), or, in a full-attention block, all. */
struct cuda_vision_tile {
    int32_t q_first, q_count, k_first, k_count;
};
enum { CUDA_VISION_TILE_QUERIES = 64, CUDA_VISION_MAX_HEAD_DIM = 128 };

/* Patch embedding as one product: x [n][n_embd] = patches [n][patch_dim] . kernel^T, kernel
 * [n_embd][patch_dim] f32 (both frames' kernels laid out as a patch is); f32 sums. */
pshard_status cuda_vision_patch_embed(const float *patches, const float *kernel, int64_t n, int64_t n_embd,
                                      int64_t patch_dim, float *x, cuda_stream s);
/* The 2D rotary turn: per head of x [n][n_head * head_dim], pair (i, i + head_dim / 2) turned by
 * cs [n][head_dim / 2][2] (cos, sin) of its patch. */
pshard_status cuda_vision_rope(float *x, const float *cs, int64_t n, int n_head, int head_dim, cuda_stream s);
/* Attention without a mask matrix: per tile (device array [n_tiles], q_count at most
 * CUDA_VISION_TILE_QUERIES) and head, its queries over its keys, softmax(q.k * scale) . v with an
 * online softmax over chunks of keys, so no score matrix exists. q [n][n_head * head_dim] is
 * overwritten by the output (each tile reads only its own rows of it); head_dim at most
 * CUDA_VISION_MAX_HEAD_DIM. f32 throughout, or with tensor_cores (and head_dim a multiple of 16)
 * q, k, v and the probabilities rounded to f16 for WMMA products with f32 sums. */
pshard_status cuda_vision_attention(float *q_out, const float *k, const float *v, const struct cuda_vision_tile *tiles,
                                    int64_t n_tiles, int n_head, int head_dim, float scale, bool tensor_cores,
                                    cuda_stream s);
/* x = 0.5 x (1 + erf(x / sqrt 2)) in place (the merger's exact GELU). */
pshard_status cuda_gelu_erf(float *x, int64_t n, cuda_stream s);

#ifdef __cplusplus
}
#endif

#endif
