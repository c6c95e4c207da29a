/* pshard public C API: status codes, errors, version. Grows with each module. */
#ifndef PSHARD_H
#define PSHARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PSHARD_VERSION "0.1.0"

/* Every public function returns a status; the message of the last failure on this thread is
 * available from pshard_last_error(). */
typedef enum pshard_status {
    PSHARD_OK = 0,
    PSHARD_ERR_IO,          /* a file could not be opened, read or mapped */
    PSHARD_ERR_FORMAT,      /* input is malformed (bad magic, truncated, out of bounds, ...) */
    PSHARD_ERR_UNSUPPORTED, /* well-formed but not supported (architecture, tensor type, ...) */
    PSHARD_ERR_NOT_FOUND,   /* a key, tensor or file that was asked for does not exist */
    PSHARD_ERR_INVALID_ARG, /* the caller passed a bad argument */
    PSHARD_ERR_NOMEM,       /* an allocation failed */
    PSHARD_ERR_RANGE,       /* a value or size is outside what is allowed */
    PSHARD_ERR_INTERNAL,    /* a bug: an invariant did not hold */
    PSHARD_ERR_BUSY,        /* no room now (a full queue of requests): try again later */
} pshard_status;

/* Message describing the last failure on the calling thread ("" if none). */
const char *pshard_last_error(void);

/* Short name of a status code ("ok", "format error", ...). */
const char *pshard_status_name(pshard_status status);

/* Bytes as pshard's messages write them: "1.23 GB", "456.7 MB", "12.0 KB", "17 B" (powers of 1000,
 * as disk sizes are quoted). Returns buf. */
const char *pshard_format_bytes(uint64_t bytes, char *buf, size_t buf_size);

/* ---- A model file without its weights: what it holds, its tokenizer. */

/* What `pshard info` prints. */
enum {
    PSHARD_DESCRIBE_SHARDS = 1 << 0,   /* the shard list the planner places */
    PSHARD_DESCRIBE_METADATA = 1 << 1, /* every metadata key with its type and value */
    PSHARD_DESCRIBE_TENSORS = 1 << 2,  /* every tensor: name, type, shape, offset, bytes */
};

/* Writes a description of a GGUF file to out: its file and architecture, hyperparameters, tensor
 * types and sizes, and what flags (PSHARD_DESCRIBE_*) ask for; for a vision encoder (mmproj) file,
 * its image, patch, layer and projector settings. Where the model cannot be read as one pshard
 * runs, it still writes what it can (the types, metadata and tensors) and returns the error. */
pshard_status pshard_describe(const char *model_path, unsigned flags, FILE *out);

/* The context the model was trained for (0 when the file does not say). */
pshard_status pshard_model_context(const char *model_path, uint32_t *n_ctx_train);

/* A model's tokenizer alone, read from its file without its weights. */
typedef struct pshard_vocab pshard_vocab;
pshard_status pshard_vocab_load(const char *model_path, pshard_vocab **out);
void pshard_vocab_free(pshard_vocab *vocab);
/* As pshard_tokenize and pshard_token_piece, for a vocabulary loaded alone. */
pshard_status pshard_vocab_tokenize(const pshard_vocab *vocab, const char *text, int parse_special, int32_t **tokens,
                                    int32_t *n_tokens);
pshard_status pshard_vocab_piece(const pshard_vocab *vocab, int32_t token, const char **piece, size_t *len);

/* ---- Loading a model and generating text. */

typedef struct pshard_ctx pshard_ctx;

/* Called while a model loads: done and total bytes (return nonzero to cancel). */
typedef int (*pshard_progress_cb)(void *user, uint64_t done_bytes, uint64_t total_bytes);


/* Plan families (`--plan`): auto, per step size the placement the cost model predicts fastest;
 * cpu, every shard on the CPU; gpu, every shard on the GPU, resident by priority and the rest
 * streamed; static, resident by priority and the rest on the CPU; dynamic, resident by priority
 * and of the rest a share streamed while the CPU computes the others (docs/architecture.md). */
typedef enum pshard_plan_family {
    PSHARD_PLAN_AUTO = 0,
    PSHARD_PLAN_CPU,
    PSHARD_PLAN_GPU,
    PSHARD_PLAN_STATIC,
    PSHARD_PLAN_DYNAMIC,
} pshard_plan_family;

/* A family by its name ("auto", "cpu", "gpu", "static", "dynamic"); PSHARD_ERR_INVALID_ARG names
 * the text otherwise. */
pshard_status pshard_parse_plan_family(const char *text, pshard_plan_family *family);
/* A resident set by name, as pshard_params.resident_set takes it: 1 "no-ring", 2 "ring", 3 "all-kv". */
pshard_status pshard_parse_resident_set(const char *text, int *resident_set);
/* A decode set by name, as pshard_params.decode_set takes it: -1 "same", else as pshard_parse_resident_set. */
pshard_status pshard_parse_decode_set(const char *text, int *decode_set);
/* A size: a number with an optional unit K, M, G, T (powers of 1024) or B ("2G", "1536M", "0"). */
pshard_status pshard_parse_size(const char *text, int64_t *bytes);

typedef struct pshard_params {
    const char *model_path;
    int32_t n_ctx;       /* positions per sequence; 0: 4096 or the model's training context if smaller */
    int32_t n_batch;     /* most tokens per step (prompt micro-batch); 0: the automatic plan's choice of
                            512 or 1024 under a budget the model does not fit whole, else 512 */
    int32_t n_threads;   /* 0: all cores */
    int prefault;        /* read the weights into memory at load (with progress) rather than on first use */
    int gpu;             /* run every shard on the GPU, all weights resident in VRAM (plan gpu, no budget) */
    int64_t vram_budget; /* bytes of VRAM pshard may use (CUDA context excluded); 0: CPU only */
    pshard_plan_family plan; /* where the shards run (auto: the planner chooses per step size) */
    float stream_share;  /* dynamic plans: share of the non-resident experts streamed to the GPU (0: balanced,
                            so streaming and the CPU finish together) */
    int resident_set;    /* gpu, static and dynamic plans: 0 as the family wants; else one of the sets the
                            automatic planner weighs: 1 without room for the staging ring, 2 with it,
                            3 with it and every layer's KV cache first (`pshard plan --set`) */
    int decode_set;      /* automatic plans: 0 decode steps (fewer than 16 tokens) run over a resident set of
                            their own where the planner predicts that pays, VRAM carved anew when the
                            phase changes; -1 over the prompt steps' set; 1..3 over that set (as
                            resident_set) whenever it differs from the prompt steps' (`--decode-set`) */
    int no_profile;      /* automatic plans: use conservative defaults rather than measuring this
                            machine on first use (the measured profile is cached per machine) */
    int no_mmproj_offload; /* encode images with the vision encoder on the CPU even where the context has
                            the GPU (`--no-mmproj-offload`); by default a context with the GPU encodes
                            them there where the encoding fits its VRAM budget */
    int32_t n_predict;   /* automatic plans: the tokens a request is expected to generate, which the
                            planner weighs its choices by (a prompt, then this many); 0: 128 */
    int32_t n_parallel;  /* sequences that run at once (pshard_request_add); 0: 1. With more than one,
                            n_ctx is the KV cells all of them share (0: 4096 each), and each may grow
                            to all of them, up to the context the model was trained for */
    int32_t max_queue;   /* requests that may wait for a sequence; 0: 4096 */
    int vram_follow;     /* follow the device's free memory (pshard_follow_free_vram) from the start,
                            leaving vram_keep bytes (0: 1 GiB) to other programs; vram_budget is the
                            first budget (0: the device's free memory less vram_keep, at load) */
    int64_t vram_keep;
    int32_t vram_poll_ms; /* following free memory: the least time between two checks; 0: 200 ms */
    pshard_progress_cb progress;
    void *progress_user;
    /* Called while this machine is measured for planning (first use): what, and the fraction done. */
    void (*profile_progress)(void *user, const char *what, double done);
} pshard_params;

void pshard_params_default(pshard_params *params);
pshard_status pshard_open(const pshard_params *params, pshard_ctx **out);
void pshard_close(pshard_ctx *ctx);

typedef struct pshard_sampling {
    float temperature;       /* 0: greedy */
    int32_t top_k;           /* 0: off */
    float top_p, min_p;      /* 1 and 0: off */
    float repeat_penalty;    /* 1: off */
    float presence_penalty, frequency_penalty;
    int32_t penalty_last_n;
    uint64_t seed;
} pshard_sampling;

void pshard_sampling_default(pshard_sampling *sampling);

typedef struct pshard_message {
    const char *role; /* "system", "user" or "assistant" */
    const char *content;
} pshard_message;

/* Receives generated text as it is produced, in whole UTF-8 characters; return nonzero to stop. */
typedef int (*pshard_text_cb)(void *user, const char *text, size_t len);

typedef struct pshard_gen_stats {
    int32_t n_prompt;         /* prompt tokens processed (after reuse of a cached prefix) */
    int32_t n_prompt_cached;  /* prompt tokens reused from the previous call */
    int32_t n_generated;
    double prefill_ms;        /* processing the prompt */
    double ttft_ms;           /* start of the call to the first generated token */
    double decode_ms;         /* the generated tokens after the first */
    uint64_t decode_weight_bytes; /* weight bytes read per decode step (mean) */
    uint64_t decode_streamed_bytes; /* of those, bytes that crossed PCIe */
    uint64_t prefill_streamed_bytes; /* weight bytes the prompt's steps moved over PCIe */
    /* A decode step with a GPU (mean): the host computing the CPU's shards and experts, and the
     * host waiting for the GPU (0 without one). */
    double decode_host_compute_ms, decode_host_wait_ms;
    /* A diagnostic, 0 from a context pshard_open made: where the tool that opened it traces
     * hand-offs (`pshard run` under PSHARD_TRACE_HANDOFFS), a replayed decode step's hand-offs to
     * the CPU timed on the GPU (mean per step): its work between them, the hand-offs themselves
     * (its own part of the layer, then waiting for the host's), and how many there were. */
    double decode_gpu_between_ms, decode_gpu_handoff_ms;
    int32_t decode_handoffs;
    int stopped_by_eog;       /* ended at an end-of-generation token */
    int32_t n_images_encoded; /* images of the prompt encoded by this call (the others were kept) */
    double image_encode_ms;   /* decoding, preprocessing and encoding them (inside ttft_ms); of images
                                 prepared beforehand (pshard_image_prepare), their encoding alone */
    /* What the planner's cost model predicted for this call (0 when the plan was not chosen by
     * it): the prompt's steps, and one decode step. */
    double predicted_prefill_ms, predicted_decode_step_ms;
    /* Where the images encoded by this call took their memory: of n_images_encoded, how many the
     * GPU encoded in the whole VRAM budget (too large for the scratch lent between steps: the
     * language model's cells went to the host and its plan was carved again after, its resident
     * weights copied up), and how many the CPU encoded; the rest the GPU did in the lent scratch. */
    int32_t n_images_whole_budget, n_images_cpu;
} pshard_gen_stats;

typedef struct pshard_gen_opts {
    int32_t n_predict;      /* most tokens to generate; < 0: until the context is full */
    pshard_sampling sampling;
    int parse_special;      /* recognize special-token text (e.g. <|im_start|>) in the prompt */
    int ignore_eos;         /* keep generating past end-of-generation tokens (benchmarks) */
    int default_system;     /* chat: insert the template's own default system message when the
                               conversation has none (off: small models often answer worse) */
    int32_t *out_tokens;    /* optional: the generated ids */
    int32_t out_tokens_cap;
    /* optional: called after each step of the prompt with the prompt tokens processed so far and
     * how many there are (those reused from the previous call not counted); return nonzero to stop:
     * the call then fails ("prompt cancelled ...") and keeps no KV cells (the next call computes
     * its whole prompt) */
    int (*on_prompt)(void *user, int32_t done, int32_t total);
    void *prompt_user;
    /* Images (pshard_vision_load first): one for each PSHARD_IMAGE_MARKER of the prompt, in order.
     * Each is encoded once and kept, by its content, while later calls' prompts hold it. */
    const struct pshard_image *images;
    int32_t n_images;
    /* optional: called while an image is encoded: which (0-based), of how many in this call's
     * prompt, and the fraction of its encoder done; return nonzero to stop (the call fails) */
    int (*on_image)(void *user, int32_t image, int32_t n_images, float done);
    void *image_user;
} pshard_gen_opts;

void pshard_gen_opts_default(pshard_gen_opts *opts);

/* Generate a continuation of raw text (no chat formatting). The KV cache keeps the longest
 * common prefix with the previous call, so a growing conversation is not recomputed. */
pshard_status pshard_generate(pshard_ctx *ctx, const char *prompt, const pshard_gen_opts *opts,
                              pshard_text_cb on_text, void *user, pshard_gen_stats *stats);

/* Format messages with the model's chat template and generate the assistant's reply. */
pshard_status pshard_chat(pshard_ctx *ctx, const pshard_message *messages, size_t n_messages,
                          const pshard_gen_opts *opts, pshard_text_cb on_text, void *user, pshard_gen_stats *stats);

/* ---- Many sequences at once (continuous batching).
 *
 * A context opened with n_parallel N holds up to N sequences. Requests are added at any time and
 * wait in a queue until a sequence is free; each pshard_step runs one step carrying the new tokens
 * of every active request (prompt chunks of some, one decode token of others), so requests join
 * and leave between any two steps. A request's tokens reach its callback as they are sampled; the
 * last event of a request says why it finished. A finished or cancelled request's KV cells are
 * free for the next step. pshard_generate and pshard_chat may not run while requests are active. */

typedef enum pshard_finish_reason {
    PSHARD_FINISH_NONE = 0,  /* still generating */
    PSHARD_FINISH_STOP,      /* an end-of-generation token or a stop string */
    PSHARD_FINISH_LENGTH,    /* the request's token limit, or the sequence's context is full */
    PSHARD_FINISH_CANCELLED, /* pshard_request_cancel, or the callback asked to stop */
    PSHARD_FINISH_ERROR,     /* the request could not run (pshard_last_error() is not kept: see error) */
} pshard_finish_reason;

/* Short name of a finish reason: "stop", "length", "cancelled", "error" ("" while generating). */
const char *pshard_finish_name(pshard_finish_reason finish);

typedef struct pshard_request_stats {
    int32_t n_prompt;        /* prompt tokens */
    int32_t n_prompt_cached; /* of those, reused from cells already computed (a shared prefix) */
    int32_t n_generated;     /* tokens generated (an end-of-generation token not counted) */
    double queued_ms;        /* from pshard_request_add until a sequence took it */
    double ttft_ms;          /* from pshard_request_add to its first generated token */
    double total_ms;         /* from pshard_request_add to its end */
} pshard_request_stats;

/* One event of a request: a generated token (token >= 0) with its text in whole UTF-8 characters
 * (len may be 0 while a character is incomplete, or when a stop string may be starting), and, on
 * its last event, why it finished (token then -1 where no token came with it). */
typedef struct pshard_token_event {
    int32_t request;                    /* the id pshard_request_add gave */
    int32_t token;
    const char *text;
    size_t len;
    float logprob;                      /* the token's log-probability under the model's raw distribution
                                           (NaN unless top_logprobs >= 0) */
    pshard_finish_reason finish;        /* PSHARD_FINISH_NONE until the last event */
    const pshard_request_stats *stats;  /* on the last event; else NULL */
    const char *error;                  /* PSHARD_FINISH_ERROR: what went wrong */
    int32_t n_top;                      /* with top_logprobs asked for: the most likely tokens, */
    const int32_t *top_tokens;          /* most likely first, and their log-probabilities */
    const float *top_logprobs;
} pshard_token_event;

/* Hears each event; return nonzero to cancel the request (its last event follows at once). */
typedef int (*pshard_event_cb)(void *user, const pshard_token_event *event);

typedef struct pshard_request {
    const char *prompt;           /* raw text (format chat yourself, or use pshard_format_chat) */
    const int32_t *prompt_tokens; /* or tokens, when prompt is NULL */
    int32_t n_prompt_tokens;
    int32_t n_predict;            /* most tokens to generate; < 0: until the sequence's context is full */
    pshard_sampling sampling;     /* its own sampler and seed */
    int parse_special;            /* recognize special-token text in the prompt */
    int ignore_eos;               /* keep generating past end-of-generation tokens (benchmarks) */
    const char *const *stop;      /* stop strings: generation ends before the first one that appears */
    size_t n_stop;
    int32_t top_logprobs;         /* < 0: no log-probabilities; 0: each token's own; 1..20: also that many
                                     of the most likely tokens at each step */
    pshard_event_cb on_event;
    void *user;
    /* Images (pshard_vision_load first): one for each PSHARD_IMAGE_MARKER of prompt (a text prompt),
     * in order. pshard_request_add decodes and encodes them (images the context keeps, by content,
     * from earlier requests and calls are not encoded again; prepared ones it only encodes), so their
     * bytes may go once it returns; a bad image fails it, naming the image ("image 2: ..."). */
    const struct pshard_image *images;
    int32_t n_images;
    /* optional: the most tokens to generate, given the prompt's length (its images' tokens
     * counted), in place of n_predict; called once by pshard_request_add with user */
    int32_t (*n_predict_for)(void *user, int32_t n_prompt);
} pshard_request;

void pshard_request_default(pshard_request *req);

/* Queue a request (its prompt is tokenized and checked now: an empty prompt or one longer than a
 * sequence's context or the KV pool fails here (PSHARD_ERR_INVALID_ARG, PSHARD_ERR_RANGE), a full
 * queue with PSHARD_ERR_BUSY, and nothing is queued). *id names it in events. */
pshard_status pshard_request_add(pshard_ctx *ctx, const pshard_request *req, int32_t *id);

/* Cancel a queued or active request: its last event (PSHARD_FINISH_CANCELLED) is delivered now,
 * and its cells are free. An id that is not running (finished, or never given) fails. */
pshard_status pshard_request_cancel(pshard_ctx *ctx, int32_t id);

/* Run one step over the active requests, admitting queued ones first. *n_pending (optional) is
 * how many requests remain, queued or active (0: nothing left to do; the step did nothing). */
pshard_status pshard_step(pshard_ctx *ctx, int32_t *n_pending);

/* What the scheduler holds now. */
typedef struct pshard_batch_info {
    int32_t n_parallel;          /* sequences the context holds */
    int32_t n_active, n_queued;
    int32_t n_cells, n_cells_free; /* KV cells of all sequences, and those no request holds (a finished
                                      request's are kept for a later one that starts alike, until needed) */
    int32_t last_step_tokens;    /* new tokens the last step carried */
    char last_step_plan[16];     /* the plan family that ran it */
} pshard_batch_info;
void pshard_get_batch_info(const pshard_ctx *ctx, pshard_batch_info *info);

/* Format messages with the model's chat template, ready for generation; *out is malloc'd, the
 * caller frees it. */
pshard_status pshard_format_chat(pshard_ctx *ctx, const pshard_message *messages, size_t n_messages, int default_system,
                                 char **out);

/* The tokens of a text as a prompt is read: the model's leading special tokens (BOS) where it wants
 * them, special-token text recognized with parse_special. *tokens is malloc'd (the caller frees it). */
pshard_status pshard_tokenize(pshard_ctx *ctx, const char *text, int parse_special, int32_t **tokens, int32_t *n_tokens);

/* A token's bytes as the model spells it (special tokens as their text); *piece stays valid while
 * the context is open. */
pshard_status pshard_token_piece(const pshard_ctx *ctx, int32_t token, const char **piece, size_t *len);

/* Hears the logits of one position of pshard_eval (n_vocab floats); return nonzero to stop. */
typedef int (*pshard_logits_cb)(void *user, int32_t position, const float *logits, int32_t n_vocab);

/* Logits of every position of a token sequence, for comparing placements and implementations: the
 * tokens run from the start of the one-sequence calls' sequence in steps of steps[k % n_steps]
 * tokens (1 to n_batch; NULL: n_batch each), and each position's logits reach on_logits in order.
 * Forgets what that sequence held before and after; fails while requests are running. */
pshard_status pshard_eval(pshard_ctx *ctx, const int32_t *tokens, int32_t n_tokens, const int32_t *steps, int32_t n_steps,
                          pshard_logits_cb on_logits, void *user);

/* ---- The VRAM budget while running (beside other GPU programs, a game say).
 *
 * Call these between steps from the thread that owns the context (a callback of pshard_generate,
 * pshard_chat or pshard_step included). A change re-plans from the machine profile the context
 * plans with (nothing is measured) and carves VRAM anew before it returns: resident weights that
 * no longer fit are dropped (their host copy is the mapped file), the KV cells of layers that leave
 * VRAM move to host memory, and the old device arena is freed, so the memory given up is the
 * driver's when the call returns; then the new arena is allocated and its resident weights and
 * cells copied up. Requests in flight go on at the next step and give the tokens they give at a
 * constant budget. This version is synchronous: steps wait while the weights are copied up. */

/* A budget as text: a size ("4G", "4096M", "0") or a count of bytes (*follow 0), or "auto" /
 * "auto:keep=SIZE" (*follow 1, *keep_bytes the memory left to other programs, default 1 GiB). */
pshard_status pshard_parse_vram_budget(const char *text, int64_t *bytes, int *follow, int64_t *keep_bytes);

/* Change the budget of a context on the GPU, and stop following free memory. Fails and changes
 * nothing for a budget below the least the model needs (PSHARD_ERR_RANGE; the message names the
 * least), a negative one, 0 (the CPU alone) on the GPU, or any on a context opened on the CPU
 * alone. Where the new arena cannot be had (another program took the memory meanwhile) it fails
 * with the cells kept on the host, and steps fail until a budget that fits is set. */
pshard_status pshard_set_vram_budget(pshard_ctx *ctx, int64_t bytes);

/* Follow the device's free memory: at step boundaries, at most every vram_poll_ms, the budget
 * becomes what pshard holds plus what is free, less keep_bytes (0: 1 GiB): cut at once when free
 * memory falls 64 MiB below keep_bytes, raised once it has stayed 512 MiB above for a second; never
 * above what the model needs whole, never below its least (it stays there, with a warning). */
pshard_status pshard_follow_free_vram(pshard_ctx *ctx, int64_t keep_bytes);

/* While following free memory: the check a step makes, for a caller with nothing to step (a
 * server waiting for requests); at most every vram_poll_ms, else nothing. */
pshard_status pshard_budget_poll(pshard_ctx *ctx);

/* ---- Images (vision-language models: a qwen2vl language model with its mmproj file, as
 * llama.cpp writes them; Qwen2.5-VL, Cosmos-Reason1).
 *
 * Where a prompt (or a chat message's content) holds PSHARD_IMAGE_MARKER, the model reads
 * <|vision_start|>, the image's tokens (its encoder's embeddings, with their row and column
 * positions), <|vision_end|>: in pshard_generate and pshard_chat (pshard_gen_opts.images) and in
 * requests (pshard_request.images), each sequence with its own images. A context with the GPU
 * encodes them on the GPU where the encoding fits its VRAM budget, else on the CPU
 * (pshard_params.no_mmproj_offload: always on the CPU). */
#define PSHARD_IMAGE_MARKER "<__image__>"

typedef struct pshard_prepared_image pshard_prepared_image;

/* A JPEG or PNG image: a file, or its bytes in memory (path NULL), or an image prepared already
 * (pshard_image_prepare; then path, data and size are not read). Files over 64 MiB, over 50
 * million pixels or 16384 pixels a side are refused. */
typedef struct pshard_image {
    const char *path;
    const void *data;
    size_t size;
    const pshard_prepared_image *prepared;
} pshard_image;

/* Attach the vision encoder of an mmproj file to a context. Fails, naming the problem, for a file
 * that is not an mmproj, an unsupported projector, a model that takes no images (not qwen2vl), or
 * an encoder whose output width is not the model's embedding width (the pair does not match), and
 * while requests are running. */
pshard_status pshard_vision_load(pshard_ctx *ctx, const char *mmproj_path);

/* Images prepared on other threads. An image's CPU work before its encoder (reading its file,
 * decoding the JPEG or PNG, the model's resize, normalization, patches) may run beside the thread
 * that steps the context (a server's request threads, say), so that steps do not wait for it: a
 * preparer holds a copy of the encoder's settings and needs no context once made; any threads may
 * use one at once. The call that takes a prepared image (pshard_image.prepared) only encodes it, and
 * not even that where the context keeps the image already (by content). */
typedef struct pshard_image_preparer pshard_image_preparer;

/* The preparer of ctx's vision encoder (pshard_vision_load first); its images are for that encoder
 * only (a call with another one attached refuses them). */
pshard_status pshard_image_preparer_create(const pshard_ctx *ctx, pshard_image_preparer **out);
void pshard_image_preparer_free(pshard_image_preparer *preparer);

/* Read (path) or take (data and size) an image, decode it and cut it into the encoder's patches
 * (float32, 24 bytes a pixel of the resized image). Fails as a call given the image would, naming
 * it by its path, or as "image N" for bytes where index is its place among its prompt's images
 * (from 0). *out keeps the patches and the bytes' hash, not the bytes. */
pshard_status pshard_image_prepare(const pshard_image_preparer *preparer, const pshard_image *image, int32_t index,
                                   pshard_prepared_image **out);
void pshard_prepared_image_free(pshard_prepared_image *image);
/* The host memory a prepared image holds (its patches), in bytes. */
size_t pshard_prepared_image_bytes(const pshard_prepared_image *image);

/* Facts about the loaded model and context. */
typedef struct pshard_info {
    const char *arch;
    const char *chat_format;
    int32_t n_vocab, n_ctx, n_batch, n_threads, n_layers;
    int n_batch_chosen; /* n_batch was chosen by the planner (pshard_params.n_batch 0 under a budget) */
    uint64_t weight_bytes, kv_bytes;
    int on_gpu;
    /* On the GPU: device memory outside the arena (CUDA context, cuBLAS) and the arena's parts. */
    uint64_t vram_context_bytes, vram_arena_bytes, vram_weight_bytes, vram_kv_bytes, vram_activation_bytes,
        vram_work_bytes, vram_staging_bytes, vram_mapping_bytes;
    /* Decode steps over a resident set of their own: VRAM carved anew at each change of phase, so far
     * this many times, taking this long in all (the arena's parts above are the current phase's). */
    int32_t phase_changes;
    double phase_change_ms;
    char plan[64]; /* the plan's families: "decode/prompt" (decode at a typical request's length), e.g.
                      "dynamic/gpu"; "+ decode set" when decode steps run over a resident set of
                      their own, "from N cells" or "below N cells" when only over caches that long */
    int profile_measured; /* the machine profile: 1 measured (cached or now), 0 defaults */
    double predicted_ttft_s, predicted_decode_s; /* the cost model's prediction for the plan: the first
                                                    token of a prompt of predicted_prompt_tokens (1K or
                                                    half the context), then seconds per token; with
                                                    predicted_requests > 1, that many at once: until
                                                    every prompt is read, then seconds per step of a
                                                    token of each */
    int32_t predicted_prompt_tokens, predicted_requests;
    /* The budget now (bytes; 0: the CPU alone), whether it follows free memory and what it leaves
     * (pshard_follow_free_vram); its changes so far, and the last one's time from its start until
     * the memory given up was free, and whole (the new resident weights copied up too). */
    int64_t vram_budget;
    int vram_follow;
    int64_t vram_keep;
    int32_t budget_changes;
    double budget_free_ms, budget_change_ms;
    /* the last rise: from the call until its resident weights were in VRAM (they are copied up while
     * steps go on, read from host memory meanwhile); 0 while they are on their way */
    double budget_weights_ms;
    /* the last change's parts (ms): planning, the host's KV cache pinned (where it was not), the new
     * arena allocated, and its plan carved with the KV cells copied up; the freeing is
     * budget_free_ms less the planning */
    double budget_plan_ms, budget_pin_ms, budget_arena_ms, budget_fill_ms;
    /* How long pshard_open took, in parts (ms): reading the file's header, model and tokenizer;
     * planning (this machine's profile measured, on first use, or read); touching the weights'
     * pages (pshard_params.prefault); making the executor (on a GPU: the CUDA context, the arena,
     * the file mapping pinned, the resident weights copied up); and pshard_vision_load's, of the
     * encoder loaded (0: none). */
    double load_file_ms, load_plan_ms, load_pages_ms, load_exec_ms, load_vision_ms;
} pshard_info;
void pshard_get_info(const pshard_ctx *ctx, pshard_info *info);

#ifdef __cplusplus
}
#endif

#endif /* PSHARD_H */
