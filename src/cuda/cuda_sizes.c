/* Work buffers and slices of the CUDA kernels as shape arithmetic alone (cuda_sizes.h): the same
 * in a build without CUDA, where the planner still sizes GPU plans. */
#include "cuda/cuda_sizes.h"

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

enum quant_type cuda_act_type(enum quant_type weight_type) {
    switch (weight_type) {
    case QUANT_F32: return QUANT_F32;
    case QUANT_F16: return QUANT_F16;
    case QUANT_BF16: return QUANT_BF16;
    case QUANT_Q2_K: case QUANT_Q3_K: case QUANT_Q4_K: case QUANT_Q5_K: case QUANT_Q6_K: return QUANT_Q8_K;
    default: return QUANT_Q8_1;
    }
}

size_t cuda_act_row_bytes(enum quant_type act_type, int64_t n_cols) {
    switch (act_type) {
    case QUANT_F32: return (size_t)n_cols * 4;
    case QUANT_F16: case QUANT_BF16: return (size_t)n_cols * 2;
    case QUANT_Q8_0: return (size_t)(n_cols / 32) * 34;
    case QUANT_Q8_1: return (size_t)(n_cols / 32) * 36;
    case QUANT_Q8_K: return (size_t)(n_cols / 256) * 292;
    default: return 0;
    }
}

size_t cuda_matmul_work_bytes(const struct cuda_matrix *m, int64_t n_tokens) {
    if (m->type == QUANT_F32) return 0; /* the activations read as they are */
    if (n_tokens <= CUDA_MATVEC_MAX_TOKENS)
        return align256(cuda_act_row_bytes(cuda_act_type(m->type), m->n_cols) * (size_t)n_tokens);
    const size_t x16 = align256((size_t)n_tokens * (size_t)m->n_cols * 2);
    if (m->type == QUANT_BF16) return x16; /* cuBLAS reads BF16 as it is; F16 keeps room for its copies */
    const int64_t rows = m->n_rows < (int64_t)CUDA_MATMUL_CHUNK_ROWS ? m->n_rows : (int64_t)CUDA_MATMUL_CHUNK_ROWS;
    return x16 + align256((size_t)rows * (size_t)m->n_cols * 2);
}

void cuda_decode_split(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len, int *n_splits,
                       int *split_len) {
    const int64_t per_split = (int64_t)a->n_head_kv * n_tokens, kv = max_kv_len > 0 ? max_kv_len : 1;
    int64_t splits = ceil_div(CUDA_DECODE_TARGET_BLOCKS, per_split);
    const int64_t max_splits = ceil_div(kv, CUDA_DECODE_MIN_SPLIT);
    if (splits > max_splits) splits = max_splits;
    if (splits < 1) splits = 1;
    *split_len = (int)(ceil_div(ceil_div(kv, splits), CUDA_DECODE_MIN_SPLIT) * CUDA_DECODE_MIN_SPLIT);
    *n_splits = (int)ceil_div(kv, *split_len);
}

size_t cuda_attention_decode_work_bytes(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len) {
    int n_splits, split_len;
    cuda_decode_split(a, n_tokens, max_kv_len, &n_splits, &split_len);
    return (size_t)n_tokens * (size_t)a->n_head * (size_t)n_splits * (size_t)(a->head_v + 2) * sizeof(float);
}

/* The host's partial sums follow the slices' in work, 256-byte aligned. */
static size_t host_sums_offset(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len, int32_t first) {
    return align256(cuda_attention_decode_work_bytes(a, n_tokens, max_kv_len - first));
}

size_t cuda_attention_split_work_bytes(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len, int32_t first) {
    return host_sums_offset(a, n_tokens, max_kv_len, first) + sizeof(float) * (size_t)n_tokens * a->n_head * (a->head_v + 2);
}

float *cuda_attention_host_sums(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len, int32_t first,
                                void *work) {
    return (float *)((uint8_t *)work + host_sums_offset(a, n_tokens, max_kv_len, first));
}

void cuda_prefill_split(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len, int *n_splits,
                        int *split_len) {
    const int64_t blocks = ceil_div(n_tokens > 0 ? n_tokens : 1, CUDA_PREFILL_Q_ROWS) * a->n_head;
    const int64_t kv = max_kv_len > 0 ? max_kv_len : 1;
    int64_t splits = ceil_div(CUDA_PREFILL_TARGET_BLOCKS, blocks);
    if (splits > kv / CUDA_PREFILL_MIN_SPLIT) splits = kv / CUDA_PREFILL_MIN_SPLIT;
    if (splits < 1) splits = 1;
    *split_len = (int)(ceil_div(ceil_div(kv, splits), CUDA_KV_TILE) * CUDA_KV_TILE);
    *n_splits = (int)ceil_div(kv, *split_len);
}

size_t cuda_prefill_split_bytes(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len) {
    int n_splits, split_len;
    cuda_prefill_split(a, n_tokens, max_kv_len, &n_splits, &split_len);
    if (n_splits < 2) return 0;
    return (size_t)n_tokens * (size_t)a->n_head * (size_t)n_splits * (size_t)(a->head_v + 2) * sizeof(float);
}

size_t cuda_attention_prefill_work_bytes(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len) {
    /* The slices depend on the count of tiles: each count's most tokens, until one slice. */
    size_t most = 0;
    for (int64_t tiles = 1; tiles * CUDA_PREFILL_Q_ROWS < n_tokens + CUDA_PREFILL_Q_ROWS; tiles++) {
        const int64_t n = tiles * CUDA_PREFILL_Q_ROWS < n_tokens ? tiles * CUDA_PREFILL_Q_ROWS : n_tokens;
        const size_t bytes = cuda_prefill_split_bytes(a, n, max_kv_len);
        if (bytes == 0) break;
        most = bytes > most ? bytes : most;
    }
    return most;
}

int64_t cuda_moe_matvec_bound(const struct cuda_moe *m) {
    if (m->matvec_max_tokens > 0) return m->matvec_max_tokens;
    if (!m->gate.in_place && cuda_int8_products(m->gate.type, m->gate.n_cols)) return CUDA_MOE_INT8_MATVEC_MAX;
    return cuda_moe_matvec_max_tokens(m->n_expert, m->k);
}

bool cuda_moe_tiled(const struct cuda_moe *m, int64_t n_tokens) { return n_tokens > cuda_moe_matvec_bound(m); }

struct cuda_moe_layout cuda_moe_layout(const struct cuda_moe *m, int64_t n_tokens) {
    struct cuda_moe_layout w = {.x_act_up = CUDA_NO_PART};
    const int64_t pairs = n_tokens * m->k, n_embd = m->gate.n_cols, n_ff = m->gate.n_rows, E = m->n_expert;
    const int64_t tiles = ceil_div(pairs, CUDA_GEMM_TILE_M) + (E < pairs ? E : pairs);
    size_t at = 0;
#define TAKE(part, bytes) (w.part = at, at += align256(bytes))
    TAKE(expert_start, 4 * (size_t)(E + 1));
    TAKE(active, 4 * (size_t)E);
    TAKE(n_active, 4);
    TAKE(n_tiles, 4);
    TAKE(tile_expert, 4 * (size_t)tiles);
    TAKE(tile_start, 4 * (size_t)tiles);
    TAKE(pairs, 4 * (size_t)pairs);
    TAKE(gate_out, 4 * (size_t)(pairs * n_ff));
    TAKE(up_out, 4 * (size_t)(pairs * n_ff));
    TAKE(down_out, 4 * (size_t)(pairs * m->down.n_rows));
    if (cuda_moe_tiled(m, n_tokens)) {
        /* f16, or Q8_1 for the int8 kernel (smaller); up's own where its format differs */
        TAKE(x_act, 2 * (size_t)(n_tokens * n_embd));
        if (m->up.type != m->gate.type) TAKE(x_act_up, 2 * (size_t)(n_tokens * n_embd));
        TAKE(h_act, 2 * (size_t)(pairs * n_ff));
    } else {
        TAKE(x_act, cuda_act_row_bytes(cuda_act_type(m->gate.type), n_embd) * (size_t)n_tokens);
        TAKE(x_act_up, cuda_act_row_bytes(cuda_act_type(m->up.type), n_embd) * (size_t)n_tokens);
        TAKE(h_act, cuda_act_row_bytes(cuda_act_type(m->down.type), n_ff) * (size_t)pairs);
    }
#undef TAKE
    w.bytes = at;
    return w;
}

int64_t cuda_moe_slice_tokens(const struct cuda_moe *m) {
    return m->slice_tokens > 0 ? m->slice_tokens : CUDA_MOE_SLICE_TOKENS;
}

/* The larger of a whole slice's layout and the last, shorter one's (which may take the other kernel). */
size_t cuda_moe_work_bytes(const struct cuda_moe *m, int64_t n_tokens) {
    const int64_t slice = cuda_moe_slice_tokens(m);
    if (n_tokens <= slice) return cuda_moe_layout(m, n_tokens).bytes;
    const size_t whole = cuda_moe_layout(m, slice).bytes, last = cuda_moe_layout(m, n_tokens % slice).bytes;
    return whole > last ? whole : last;
}
