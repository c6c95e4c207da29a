/* The CUDA backend's C interface when pshard is built without CUDA: no device is present, and
 * every call that would need one fails with the same message. */
#include <stdio.h>
#include <string.h>

#include "cuda/cuda_backend.h"

static pshard_status no_cuda(void) {
    return core_fail(PSHARD_ERR_UNSUPPORTED, "this build of pshard has no CUDA backend");
}

int cuda_device_count(void) { return 0; }
bool cuda_int8_products(enum quant_type type, int64_t n_cols) { return (void)type, (void)n_cols, false; }

pshard_status cuda_device_describe(int device, struct cuda_device_info *info) {
    (void)device;
    memset(info, 0, sizeof *info);
    return no_cuda();
}

pshard_status cuda_device_identify(int device, char *name, size_t name_size, int *driver_version) {
    (void)device;
    if (name_size) name[0] = 0;
    *driver_version = 0;
    return no_cuda();
}

pshard_status cuda_device_memory(uint64_t *free_bytes, uint64_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    return no_cuda();
}

pshard_status cuda_ctx_create(int device, struct cuda_ctx **out) {
    (void)device;
    *out = NULL;
    return no_cuda();
}
void cuda_ctx_destroy(struct cuda_ctx *ctx) { (void)ctx; }
const struct cuda_ctx_info *cuda_ctx_info(const struct cuda_ctx *ctx) { (void)ctx; return NULL; }
cuda_stream cuda_ctx_compute_stream(const struct cuda_ctx *ctx) { (void)ctx; return NULL; }
cuda_stream cuda_ctx_copy_stream(const struct cuda_ctx *ctx) { (void)ctx; return NULL; }
pshard_status cuda_ctx_set_blas_workspace(struct cuda_ctx *ctx, void *dev, size_t bytes) {
    (void)ctx, (void)dev, (void)bytes;
    return no_cuda();
}
void cuda_ctx_set_gemm_path(struct cuda_ctx *ctx, enum cuda_gemm_path path) { (void)ctx, (void)path; }

pshard_status cuda_arena_create(struct cuda_arena *a, size_t bytes) {
    (void)bytes;
    memset(a, 0, sizeof *a);
    return no_cuda();
}
void cuda_arena_destroy(struct cuda_arena *a) { memset(a, 0, sizeof *a); }
pshard_status cuda_arena_alloc(struct cuda_arena *a, size_t bytes, const char *what, void **out) {
    (void)a, (void)bytes, (void)what;
    *out = NULL;
    return no_cuda();
}
size_t cuda_arena_mark(const struct cuda_arena *a) { return a->used; }
void cuda_arena_reset(struct cuda_arena *a, size_t mark) { (void)a, (void)mark; }
int cuda_arena_report(const struct cuda_arena *a, char *buf, size_t len) {
    (void)a;
    return snprintf(buf, len, "device arena: none (no CUDA)");
}

pshard_status cuda_stream_create(cuda_stream *out) { *out = NULL; return no_cuda(); }
void cuda_stream_destroy(cuda_stream s) { (void)s; }
pshard_status cuda_stream_sync(cuda_stream s) { (void)s; return no_cuda(); }
pshard_status cuda_graph_capture_begin(cuda_stream s) { (void)s; return no_cuda(); }
pshard_status cuda_graph_capture_end(cuda_stream s, cuda_graph *out) { (void)s; *out = NULL; return no_cuda(); }
pshard_status cuda_graph_launch(cuda_graph g, cuda_stream s) { (void)g, (void)s; return no_cuda(); }
void cuda_graph_destroy(cuda_graph g) { (void)g; }
pshard_status cuda_flags_alloc(size_t n, struct cuda_pinned *out, uint32_t **dev) {
    (void)n, (void)out, *dev = NULL;
    return no_cuda();
}
pshard_status cuda_stamps_alloc(size_t n, struct cuda_pinned *out, uint64_t **dev) {
    (void)n, (void)out, *dev = NULL;
    return no_cuda();
}
pshard_status cuda_flag_raise(uint32_t *flag_dev, uint64_t *stamp_dev, cuda_stream s) {
    (void)flag_dev, (void)stamp_dev, (void)s;
    return no_cuda();
}
pshard_status cuda_flag_wait(uint32_t *flag_dev, uint64_t *stamp_dev, cuda_stream s) {
    (void)flag_dev, (void)stamp_dev, (void)s;
    return no_cuda();
}
pshard_status cuda_flag_host_wait(volatile uint32_t *flag, cuda_stream s) { (void)flag, (void)s; return no_cuda(); }
void cuda_flag_host_raise(volatile uint32_t *flag) { *flag = 1; }
pshard_status cuda_event_create(bool timing, cuda_event *out) { (void)timing; *out = NULL; return no_cuda(); }
void cuda_event_destroy(cuda_event e) { (void)e; }
pshard_status cuda_event_record(cuda_event e, cuda_stream s) { (void)e, (void)s; return no_cuda(); }
pshard_status cuda_stream_wait(cuda_stream s, cuda_event e) { (void)s, (void)e; return no_cuda(); }
pshard_status cuda_event_sync(cuda_event e) { (void)e; return no_cuda(); }
pshard_status cuda_event_done(cuda_event e, bool *done) { (void)e; *done = false; return no_cuda(); }
pshard_status cuda_event_elapsed_ms(cuda_event start, cuda_event end, float *ms) {
    (void)start, (void)end;
    *ms = 0;
    return no_cuda();
}

pshard_status cuda_copy_h2d(void *dst, const void *src, size_t bytes, cuda_stream s) {
    (void)dst, (void)src, (void)bytes, (void)s;
    return no_cuda();
}
pshard_status cuda_copy_d2h(void *dst, const void *src, size_t bytes, cuda_stream s) {
    (void)dst, (void)src, (void)bytes, (void)s;
    return no_cuda();
}
pshard_status cuda_copy_d2d(void *dst, const void *src, size_t bytes, cuda_stream s) {
    (void)dst, (void)src, (void)bytes, (void)s;
    return no_cuda();
}
pshard_status cuda_memset(void *dst, int value, size_t bytes, cuda_stream s) {
    (void)dst, (void)value, (void)bytes, (void)s;
    return no_cuda();
}

pshard_status cuda_host_register(void *ptr, size_t bytes, bool required, struct cuda_pinned *out) {
    memset(out, 0, sizeof *out);
    out->ptr = ptr;
    out->bytes = bytes;
    return required ? no_cuda() : PSHARD_OK; /* pageable memory is all there is */
}
pshard_status cuda_host_register_writable(void *ptr, size_t bytes, struct cuda_pinned *out) {
    return cuda_host_register(ptr, bytes, false, out);
}
pshard_status cuda_host_device_pointer(const void *host, const void **dev) {
    (void)host;
    *dev = NULL;
    return no_cuda();
}
pshard_status cuda_host_alloc(size_t bytes, struct cuda_pinned *out) {
    (void)bytes;
    memset(out, 0, sizeof *out);
    return no_cuda();
}
void cuda_pinned_release(struct cuda_pinned *p) { memset(p, 0, sizeof *p); }

bool cuda_type_supported(enum quant_type type) { (void)type; return false; }

pshard_status cuda_quantize(enum quant_type act_type, const float *x, int64_t n_cols, int64_t n_rows, void *out,
                            cuda_stream s) {
    (void)act_type, (void)x, (void)n_cols, (void)n_rows, (void)out, (void)s;
    return no_cuda();
}
pshard_status cuda_matvec(const struct cuda_matrix *m, const void *acts, int n_tokens, float *y, int64_t y_stride,
                          cuda_stream s) {
    (void)m, (void)acts, (void)n_tokens, (void)y, (void)y_stride, (void)s;
    return no_cuda();
}
pshard_status cuda_matvec_each(const struct cuda_matrix *const *m, int count, const void *acts, int n_tokens,
                               float *const *y, bool accumulate, cuda_stream s) {
    (void)m, (void)count, (void)acts, (void)n_tokens, (void)y, (void)accumulate, (void)s;
    return no_cuda();
}
pshard_status cuda_matmul(struct cuda_ctx *ctx, const struct cuda_matrix *m, const float *x, int64_t n_tokens,
                          float *y, int64_t y_stride, void *work, size_t work_bytes, cuda_stream s) {
    (void)ctx, (void)m, (void)x, (void)n_tokens, (void)y, (void)y_stride, (void)work, (void)work_bytes, (void)s;
    return no_cuda();
}
bool cuda_matmul_reads_once(const struct cuda_ctx *ctx, const struct cuda_matrix *m, int64_t n_tokens) {
    (void)ctx, (void)m, (void)n_tokens;
    return false;
}
pshard_status cuda_matmul_add(struct cuda_ctx *ctx, const struct cuda_matrix *m, const float *x, int64_t n_tokens,
                              float *y, float *tmp, void *work, size_t work_bytes, cuda_stream s) {
    (void)ctx, (void)m, (void)x, (void)n_tokens, (void)y, (void)tmp, (void)work, (void)work_bytes, (void)s;
    return no_cuda();
}
pshard_status cuda_dequantize_f16(const struct cuda_matrix *m, int64_t row0, int64_t n_rows, uint16_t *out,
                                  cuda_stream s) {
    (void)m, (void)row0, (void)n_rows, (void)out, (void)s;
    return no_cuda();
}
pshard_status cuda_get_rows(const struct cuda_matrix *m, const int32_t *rows, int64_t n, float *out, cuda_stream s) {
    (void)m, (void)rows, (void)n, (void)out, (void)s;
    return no_cuda();
}

pshard_status cuda_rmsnorm(const float *x, const float *w, float *out, int64_t n_rows, int64_t n, float eps,
                           cuda_stream s) {
    (void)x, (void)w, (void)out, (void)n_rows, (void)n, (void)eps, (void)s;
    return no_cuda();
}
pshard_status cuda_add(float *acc, const float *x, int64_t n, cuda_stream s) {
    (void)acc, (void)x, (void)n, (void)s;
    return no_cuda();
}
pshard_status cuda_add_bias(float *x, const float *bias, int64_t n_rows, int64_t n, cuda_stream s) {
    (void)x, (void)bias, (void)n_rows, (void)n, (void)s;
    return no_cuda();
}
pshard_status cuda_swiglu(const float *gate, const float *up, float *out, int64_t n, cuda_stream s) {
    (void)gate, (void)up, (void)out, (void)n, (void)s;
    return no_cuda();
}
pshard_status cuda_swiglu_quantize(enum quant_type act_type, const float *gate, const float *up, int64_t n_cols,
                                   int64_t n_rows, void *q, cuda_stream s) {
    (void)act_type, (void)gate, (void)up, (void)n_cols, (void)n_rows, (void)q, (void)s;
    return no_cuda();
}
bool cuda_writes_act(enum quant_type act_type) {
    (void)act_type;
    return false;
}
pshard_status cuda_rope_table(const struct rope_params *p, const float *freq_factors, const int32_t *pos,
                              int64_t pos_stride, int64_t n_tokens, float *cs, cuda_stream s) {
    (void)p, (void)freq_factors, (void)pos, (void)pos_stride, (void)n_tokens, (void)cs, (void)s;
    return no_cuda();
}
pshard_status cuda_rope_apply(const struct rope_params *p, const float *cs, float *x, int64_t n_tokens, int n_heads,
                              int head_size, cuda_stream s) {
    (void)p, (void)cs, (void)x, (void)n_tokens, (void)n_heads, (void)head_size, (void)s;
    return no_cuda();
}

pshard_status cuda_kv_store(const struct cuda_kv_layer *kv, const float *k, const float *v, int64_t k_width,
                            int64_t v_width, const int32_t *seq, const int32_t *pos, int64_t n_tokens, cuda_stream s) {
    (void)kv, (void)k, (void)v, (void)k_width, (void)v_width, (void)seq, (void)pos, (void)n_tokens, (void)s;
    return no_cuda();
}
bool cuda_attention_decode_quantizes(const struct cuda_attn_shape *a, enum quant_type q_type) {
    (void)a, (void)q_type;
    return false;
}
pshard_status cuda_attention_decode_quantized(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv,
                                              const float *q, const int32_t *seq, const int32_t *pos, int64_t n_tokens,
                                              int32_t max_kv_len, float *out, enum quant_type q_type, void *q_out,
                                              void *work, size_t work_bytes, cuda_stream s) {
    (void)a, (void)kv, (void)q, (void)seq, (void)pos, (void)n_tokens, (void)max_kv_len, (void)out, (void)q_type, (void)q_out;
    (void)work, (void)work_bytes, (void)s;
    return no_cuda();
}
pshard_status cuda_attention_decode_from(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv, const float *q,
                                         const int32_t *seq, const int32_t *pos, int64_t n_tokens, int32_t max_kv_len,
                                         int32_t first, void *work, size_t work_bytes, cuda_stream s) {
    (void)a, (void)kv, (void)q, (void)seq, (void)pos, (void)n_tokens, (void)max_kv_len, (void)first, (void)work;
    (void)work_bytes, (void)s;
    return no_cuda();
}
pshard_status cuda_attention_merge_host(const struct cuda_attn_shape *a, int64_t n_tokens, int32_t max_kv_len, int32_t first,
                                        float *out, enum quant_type q_type, void *q_out, void *work, cuda_stream s) {
    (void)a, (void)n_tokens, (void)max_kv_len, (void)first, (void)out, (void)q_type, (void)q_out, (void)work, (void)s;
    return no_cuda();
}
pshard_status cuda_attention_decode(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv, const float *q,
                                    const int32_t *seq, const int32_t *pos, int64_t n_tokens, int32_t max_kv_len,
                                    float *out, void *work, size_t work_bytes, cuda_stream s) {
    (void)a, (void)kv, (void)q, (void)seq, (void)pos, (void)n_tokens, (void)max_kv_len, (void)out, (void)work;
    (void)work_bytes, (void)s;
    return no_cuda();
}
pshard_status cuda_attention_prefill(const struct cuda_attn_shape *a, const struct cuda_kv_layer *kv, const float *q,
                                     int32_t seq, const int32_t *pos, int64_t n_tokens, int32_t max_kv_len, float *out,
                                     void *work, size_t work_bytes, cuda_stream s) {
    (void)a, (void)kv, (void)q, (void)seq, (void)pos, (void)n_tokens, (void)max_kv_len, (void)out, (void)work;
    (void)work_bytes, (void)s;
    return no_cuda();
}

pshard_status cuda_norm_rope(const struct rope_params *p, const float *cs, float *x, const float *w, float eps,
                             int64_t n_tokens, int n_heads, int head_size, cuda_stream s) {
    (void)p, (void)cs, (void)x, (void)w, (void)eps, (void)n_tokens, (void)n_heads, (void)head_size, (void)s;
    return no_cuda();
}
pshard_status cuda_norm_rope_qk_store(const struct rope_params *p, const float *cs, float *q, const float *q_norm,
                                      int n_head, float *k, const float *k_norm, int n_head_kv, float eps, int64_t n_tokens,
                                      int head_size, const struct cuda_kv_layer *kv, const float *v, int head_v,
                                      const int32_t *seq, const int32_t *pos, cuda_stream s) {
    (void)p, (void)cs, (void)q, (void)q_norm, (void)n_head, (void)k, (void)k_norm, (void)n_head_kv, (void)eps, (void)n_tokens;
    (void)head_size, (void)kv, (void)v, (void)head_v, (void)seq, (void)pos, (void)s;
    return no_cuda();
}
pshard_status cuda_rope_qk_store(const struct rope_params *p, const float *cs, float *q, int n_head, float *k,
                                 int n_head_kv, int64_t n_tokens, int head_size, const struct cuda_kv_layer *kv,
                                 const float *v, int head_v, const int32_t *seq, const int32_t *pos, cuda_stream s) {
    (void)p, (void)cs, (void)q, (void)n_head, (void)k, (void)n_head_kv, (void)n_tokens, (void)head_size, (void)kv, (void)v,
        (void)head_v, (void)seq, (void)pos, (void)s;
    return no_cuda();
}
pshard_status cuda_moe_route_mirror(const float *logits, int64_t n_tokens, int n_expert, int k, bool normalize,
                                    int32_t *ids, float *weights, int32_t *mirror, cuda_stream s) {
    (void)logits, (void)n_tokens, (void)n_expert, (void)k, (void)normalize, (void)ids, (void)weights, (void)mirror, (void)s;
    return no_cuda();
}
pshard_status cuda_rmsnorm_mirror(const float *x, const float *w, float *out, float *mirror, int64_t n_rows, int64_t n,
                                  float eps, cuda_stream s) {
    (void)x, (void)w, (void)out, (void)mirror, (void)n_rows, (void)n, (void)eps, (void)s;
    return no_cuda();
}
pshard_status cuda_rmsnorm_quantize(enum quant_type act_type, const float *x, const float *w, float *out, float *mirror,
                                    void *q, int64_t n_rows, int64_t n, float eps, cuda_stream s) {
    (void)act_type, (void)x, (void)w, (void)out, (void)mirror, (void)q, (void)n_rows, (void)n, (void)eps, (void)s;
    return no_cuda();
}
pshard_status cuda_moe_route(const float *logits, int64_t n_tokens, int n_expert, int k, bool normalize, int32_t *ids,
                             float *weights, cuda_stream s) {
    (void)logits, (void)n_tokens, (void)n_expert, (void)k, (void)normalize, (void)ids, (void)weights, (void)s;
    return no_cuda();
}
pshard_status cuda_moe_routed_mask(const int32_t *ids, int k, int first, const uint8_t *quota, int n_expert,
                                   bool resident_too, uint8_t *mask, cuda_stream s) {
    (void)ids, (void)k, (void)first, (void)quota, (void)n_expert, (void)resident_too, (void)mask, (void)s;
    return no_cuda();
}
bool cuda_moe_fuses(const struct cuda_moe *m, int64_t n_tokens) { (void)m, (void)n_tokens; return false; }
pshard_status cuda_moe_ffn(const struct cuda_moe *m, const float *x, const int32_t *ids, const float *weights,
                           int64_t n_tokens, float *out, bool accumulate, void *work, size_t work_bytes,
                           cuda_stream s) {
    (void)m, (void)x, (void)ids, (void)weights, (void)n_tokens, (void)out, (void)accumulate, (void)work;
    (void)work_bytes, (void)s;
    return no_cuda();
}
pshard_status cuda_moe_ffn_quantized(const struct cuda_moe *m, const float *x, const void *x_act, const int32_t *ids,
                                     const float *weights, int64_t n_tokens, float *out, bool accumulate, void *work,
                                     size_t work_bytes, cuda_stream s) {
    (void)m, (void)x, (void)x_act, (void)ids, (void)weights, (void)n_tokens, (void)out, (void)accumulate, (void)work;
    (void)work_bytes, (void)s;
    return no_cuda();
}
pshard_status cuda_moe_ffn_grouped(const struct cuda_moe *m, const float *x, const int32_t *ids, const float *weights,
                           int64_t n_tokens, float *out, bool accumulate, void *work, size_t work_bytes,
                           cuda_stream s) {
    (void)m, (void)x, (void)ids, (void)weights, (void)n_tokens, (void)out, (void)accumulate, (void)work;
    (void)work_bytes, (void)s;
    return no_cuda();
}

pshard_status cuda_vision_patch_embed(const float *patches, const float *kernel, int64_t n, int64_t n_embd,
                                      int64_t patch_dim, float *x, cuda_stream s) {
    (void)patches, (void)kernel, (void)n, (void)n_embd, (void)patch_dim, (void)x, (void)s;
    return no_cuda();
}
pshard_status cuda_vision_rope(float *x, const float *cs, int64_t n, int n_head, int head_dim, cuda_stream s) {
    (void)x, (void)cs, (void)n, (void)n_head, (void)head_dim, (void)s;
    return no_cuda();
}
pshard_status cuda_vision_attention(float *q_out, const float *k, const float *v, const struct cuda_vision_tile *tiles,
                                    int64_t n_tiles, int n_head, int head_dim, float scale, bool tensor_cores,
                                    cuda_stream s) {
    (void)q_out, (void)k, (void)v, (void)tiles, (void)n_tiles, (void)n_head, (void)head_dim, (void)scale;
    (void)tensor_cores, (void)s;
    return no_cuda();
}
pshard_status cuda_gelu_erf(float *x, int64_t n, cuda_stream s) {
    (void)x, (void)n, (void)s;
    return no_cuda();
}
