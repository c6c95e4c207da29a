/* `pshard run` (one prompt) and `pshard chat` (an interactive conversation): options, the
 * loading progress bar, streaming output and the speed report. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "pshard.h"

static void print_usage(FILE *out, const char *cmd) {
    fprintf(out,
            "usage: pshard %s [-m MODEL] %s[options]\n"
            "  -m, --model PATH        GGUF model (default: SmolLM2-135M-Instruct, or $PSHARD_MODEL)\n"
            "%s"
            "  -n, --n-predict N       most tokens to generate (default 256; 0: none, the prompt is only read;\n"
            "                          -1: until the context is full);\n"
            "                          given, the automatic plan weighs its choices by a prompt and this many\n"
            "                          generated tokens (else 128), as `pshard plan -n N` shows\n"
            "  -c, --ctx-size N        context length (default 4096; a larger one than the model was trained\n"
            "                          for is capped at that, with a notice)\n"
            "  -b, --batch-size N      prompt tokens per step (default: the automatic plan's choice of 512 or 1024\n"
            "                          under a budget the model does not fit whole, else 512)\n"
            "  -t, --threads N         CPU threads (default: all cores)\n"
            "  --temp T                temperature; 0 is greedy (default 0.8)\n"
            "  --top-k K, --top-p P, --min-p P   filters (default 40, 0.95, 0.05; 0/1/0 turn them off)\n"
            "  --repeat-penalty R, --presence-penalty P, --frequency-penalty F, --repeat-last-n N\n"
            "  --seed S                random seed (same seed, same output; default 24301; -1: drawn at random,\n"
            "                          and printed)\n"
            "  --system TEXT           system message ('default': the one the model's chat template\n"
            "                          inserts on its own; without --system none is sent)\n"
            "  --raw                   no chat template: continue the prompt text as it is\n"
            "  --mmproj PATH           the vision encoder (an mmproj GGUF) of a model that reads images\n"
            "                          (qwen2vl: Qwen2.5-VL, Cosmos-Reason1)\n"
            "  --no-mmproj-offload     encode images on the CPU even with the GPU (by default the GPU encodes\n"
            "                          them where the encoding fits the VRAM budget)\n"
            "%s"
            "  --no-prefault           do not read the weights in at load (pages load on first use)\n"
            "  --gpu                   run every shard on the GPU, all weights in VRAM\n"
            "  --vram-budget SIZE      VRAM pshard may use (2G, 2048M; 0: CPU only); the CUDA context is\n"
            "                          outside it; auto[:keep=SIZE]: follow the GPU's free memory, leaving\n"
            "                          SIZE (default 1G) to other programs (docs/budget.md). Shards are\n"
            "                          placed by the plan: --plan auto (default),\n"
            "                          cpu, gpu (all on the GPU, streaming what is not resident), static\n"
            "                          (the rest on the CPU), dynamic (what is not resident, MoE experts or\n"
            "                          dense FFN rows, split between streaming and the CPU)\n"
            "  --budget-file PATH      run, chat: the VRAM budget changes while it runs: PATH holds one budget\n"
            "                          as --vram-budget takes it, read again when it changes or on SIGUSR1\n"
            "  --plan FAMILY           auto, cpu, gpu, static or dynamic, as above; --plan gpu without a\n"
            "                          budget is --gpu\n"
            "  --stream-share F        dynamic plans: share of what is not resident (experts, FFN rows)\n"
            "                          that is streamed (default: balanced, so streaming and the CPU finish\n"
            "                          together)\n"
            "  --set SET               gpu, static and dynamic plans: the resident set, ring, no-ring or\n"
            "                          all-kv (room for the staging ring or not, or the ring and every\n"
            "                          layer's KV cache first), as `pshard plan --set` names them\n"
            "                          (default: as the plan's family wants)\n"
            "  --decode-set SET        auto plans: decode steps (fewer than 16 tokens) over this resident set\n"
            "                          (ring, no-ring, all-kv), VRAM carved anew when the phase changes, or\n"
            "                          `same` for the prompt steps' set (default: another set where the\n"
            "                          planner predicts it pays)\n"
            "  --no-profile            plan with conservative defaults rather than this machine's\n"
            "                          measured profile (auto measures it once, on first use; other\n"
            "                          families under a budget read it where it is cached)\n"
            "  --ids                   print the generated token ids after the text\n"
            "  --ignore-eos            do not stop at end-of-generation tokens (for benchmarks)\n"
            "  -q, --quiet             no load progress and no report (why the reply ended, its speed)\n",
            cmd, strcmp(cmd, "run") ? "" : "-p PROMPT ",
            strcmp(cmd, "run") ? "" : "  -p, --prompt TEXT       the prompt (required)\n",
            strcmp(cmd, "run") ? "                          (then /image PATH adds an image to your next message)\n"
                               : "  --image PATH            a JPEG or PNG the prompt is about (needs --mmproj; up to 16,\n"
                                 "                          each placed at a " PSHARD_IMAGE_MARKER " in the prompt, else before it)\n");
}

/* Returns 0 on success, 1 when help was printed, -1 on a bad option. */
int run_parse_args(int argc, char **argv, const char *cmd, struct run_opts *o) {
    memset(o, 0, sizeof *o);
    o->cmd = cmd;
    pshard_params_default(&o->params);
    pshard_gen_opts_default(&o->gen);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t k;
        double x;
        int r;
        /* Each reads the option's value (consuming it) into k or x; nonzero: refused, said why. */
#define INT(lo, hi) (v ? (i++, cli_int(cmd, a, v, lo, hi, &k)) : cli_needs_value(cmd, a))
#define REAL(lo, hi, above_lo) (v ? (i++, cli_real(cmd, a, v, lo, hi, above_lo, &x)) : cli_needs_value(cmd, a))
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { print_usage(stdout, cmd); return 1; }
        else if (!strcmp(a, "--raw")) o->raw = 1;
        else if (!strcmp(a, "--ids")) o->print_ids = 1;
        else if (!strcmp(a, "--ignore-eos")) o->gen.ignore_eos = 1;
        else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) o->quiet = 1;
        else if (!strcmp(a, "--no-prefault")) o->params.prefault = 0;
        else if (!strcmp(a, "--no-profile")) o->params.no_profile = 1;
        else if (!strcmp(a, "--gpu")) o->params.gpu = 1;
        else if ((r = cli_planning_option(cmd, argc, argv, &i, true, &o->params)) != 0) {
            if (r < 0) return -1;
            /* --plan gpu alone: as much VRAM as the plan needs */
            if (!strcmp(a, "--plan") && o->params.plan == PSHARD_PLAN_GPU && o->params.vram_budget == 0)
                o->params.vram_budget = -1;
        }
        else if (!strcmp(a, "--budget-file") && v) o->budget_file = argv[++i];
        else if (!strcmp(a, "--mmproj") && v) o->mmproj = argv[++i];
        else if (!strcmp(a, "--no-mmproj-offload")) o->params.no_mmproj_offload = 1;
        else if (!strcmp(a, "--image") && v && !strcmp(cmd, "run")) {
            if (o->n_images == (int32_t)(sizeof o->images / sizeof o->images[0])) {
                fprintf(stderr, "pshard %s: at most %zu images\n", cmd, sizeof o->images / sizeof o->images[0]);
                return -1;
            }
            o->images[o->n_images++] = (pshard_image){.path = argv[++i]};
        }
        else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && v) o->model = argv[++i];
        else if ((!strcmp(a, "-p") || !strcmp(a, "--prompt")) && v) o->prompt = argv[++i];
        else if (!strcmp(a, "--system") && v) {
            o->system = argv[++i];
            if (!strcmp(o->system, "default")) o->system = NULL, o->gen.default_system = 1;
        }
        else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            if (INT(-1, 1000000000)) return -1;
            o->gen.n_predict = (int32_t)k;
            o->params.n_predict = cli_request_tokens(k); /* the planner weighs by it */
        }
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) { if (INT(1, 1 << 24)) return -1; o->params.n_ctx = (int32_t)k; }
        else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) { if (INT(1, 65536)) return -1; o->params.n_batch = (int32_t)k; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (INT(1, 1024)) return -1; o->params.n_threads = (int32_t)k; }
        else if (!strcmp(a, "--temp")) { if (REAL(0, 100, false)) return -1; o->gen.sampling.temperature = (float)x; }
        else if (!strcmp(a, "--top-k")) { if (INT(0, 1000000000)) return -1; o->gen.sampling.top_k = (int32_t)k; }
        else if (!strcmp(a, "--top-p")) { if (REAL(0, 1, true)) return -1; o->gen.sampling.top_p = (float)x; }
        else if (!strcmp(a, "--min-p")) { if (REAL(0, 1, false)) return -1; o->gen.sampling.min_p = (float)x; }
        else if (!strcmp(a, "--repeat-penalty")) { if (REAL(0, 100, true)) return -1; o->gen.sampling.repeat_penalty = (float)x; }
        else if (!strcmp(a, "--presence-penalty")) { if (REAL(-100, 100, false)) return -1; o->gen.sampling.presence_penalty = (float)x; }
        else if (!strcmp(a, "--frequency-penalty")) { if (REAL(-100, 100, false)) return -1; o->gen.sampling.frequency_penalty = (float)x; }
        else if (!strcmp(a, "--repeat-last-n")) { if (INT(0, 1 << 20)) return -1; o->gen.sampling.penalty_last_n = (int32_t)k; }
        else if (!strcmp(a, "--seed")) {
            if (!v) return cli_needs_value(cmd, a);
            if (cli_seed(cmd, argv[++i], &o->gen.sampling.seed, &o->seed_drawn)) return -1;
        }
        else {
#define RUN_VALUED "-m --model -p --prompt --system --budget-file --mmproj"
            cli_refuse(cmd, a, strcmp(cmd, "run") ? RUN_VALUED : RUN_VALUED " --image");
#undef RUN_VALUED
            print_usage(stderr, cmd);
            return -1;
        }
#undef INT
#undef REAL
    }
    if (o->n_images && !o->mmproj) {
        fprintf(stderr, "pshard %s: --image needs the model's vision encoder: --mmproj PATH\n", cmd);
        return -1;
    }
    if (o->params.no_mmproj_offload && !o->mmproj) {
        fprintf(stderr, "pshard %s: --no-mmproj-offload says where the vision encoder runs: give it with --mmproj PATH\n",
                cmd);
        return -1;
    }
    if (o->seed_drawn && !o->quiet) fprintf(stderr, "seed: %" PRIu64 " (drawn at random)\n", o->gen.sampling.seed);
    return 0;
}

/* Redrawn when the percentage moves (a model of thousands of tensors reports each). */
static int progress_bar(void *user, uint64_t done, uint64_t total) {
    (void)user;
    static int shown = -1;
    const int percent = total ? (int)(100 * done / total) : 100;
    if (percent == shown && done < total) return 0;
    shown = percent;
    const int width = 30, filled = total ? (int)(width * done / total) : width;
    fprintf(stderr, "\rloading [%.*s%*s] %3d%% %.2f/%.2f GB", filled, "##############################", width - filled, "",
            percent, done / 1e9, total / 1e9);
    if (done >= total) fputc('\n', stderr);
    return 0;
}

/* A prompt of more than one step: how far it got, on one line of the terminal, cleared at the end
 * (the reply follows on the same terminal). */
static int prompt_progress(void *user, int32_t done, int32_t total) {
    (void)user;
    if (done < total) fprintf(stderr, "\rprompt: %d of %d tokens (%d%%)\033[K", done, total, (int)(100.0 * done / total));
    else fprintf(stderr, "\r\033[K");
    return 0;
}

int run_image_progress(void *user, int32_t image, int32_t n_images, float done) {
    (void)user;
    if (done < 1.0f) fprintf(stderr, "\rencoding image %d of %d: %d%%\033[K", image + 1, n_images, (int)(100 * done));
    else fprintf(stderr, "\r\033[K");
    return 0;
}

char *cli_with_image_markers(const char *text, int32_t n) {
    const size_t marker = strlen(PSHARD_IMAGE_MARKER), len = strlen(text);
    char *out = malloc(marker * (size_t)n + len + 1);
    if (!out) return NULL;
    for (int32_t i = 0; i < n; i++) memcpy(out + marker * (size_t)i, PSHARD_IMAGE_MARKER, marker);
    memcpy(out + marker * (size_t)n, text, len + 1);
    return out;
}

static int print_text(void *user, const char *text, size_t len) {
    struct cli_budget_watch *watch = user;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    cli_budget_watch_check(watch, watch->ctx);
    return 0;
}

void run_print_stats(const pshard_ctx *ctx, const pshard_gen_stats *s, int32_t n_predict, bool stopped) {
    pshard_info info;
    pshard_get_info(ctx, &info);
    char bytes[32];
    char streamed[32];
    fputc('\n', stderr);
    /* Why the reply ended, in the words of the API's finish_reason (a reply the user stopped is
     * said where it stops; -n 0 generates nothing). */
    if (!stopped && n_predict != 0) {
        if (s->stopped_by_eog) fprintf(stderr, "finish: stop (end of text)\n");
        else if (n_predict > 0 && s->n_generated >= n_predict) fprintf(stderr, "finish: length (-n %d reached)\n", n_predict);
        else fprintf(stderr, "finish: length (the context of %d tokens is full; -c sets it)\n", info.n_ctx);
    }
    fprintf(stderr, "prompt: %d tokens (%d reused) in %.0f ms = %.1f tok/s; TTFT %.0f ms; %s of weights over PCIe\n",
            s->n_prompt, s->n_prompt_cached, s->prefill_ms, s->prefill_ms > 0 ? s->n_prompt * 1e3 / s->prefill_ms : 0.0,
            s->ttft_ms, pshard_format_bytes(s->prefill_streamed_bytes, streamed, sizeof streamed));
    if (s->n_images_encoded > 0) {
        /* where the encoder ran: the GPU's lent scratch unless said */
        char where[96] = "";
        if (s->n_images_cpu == s->n_images_encoded) snprintf(where, sizeof where, ", on the CPU");
        else if (s->n_images_cpu || s->n_images_whole_budget)
            snprintf(where, sizeof where, ", on the GPU (%d in the whole VRAM budget), %d on the CPU",
                     s->n_images_whole_budget, s->n_images_cpu);
        fprintf(stderr, "images: %d encoded in %.0f ms (within the TTFT)%s\n", s->n_images_encoded, s->image_encode_ms,
                where);
    }
    if (s->n_generated > 1 && s->decode_ms > 0) {
        const double tps = (s->n_generated - 1) * 1e3 / s->decode_ms;
        fprintf(stderr, "decode: %d tokens at %.1f tok/s; %s of weights read per token = %.1f GB/s (%d threads)",
                s->n_generated, tps, pshard_format_bytes(s->decode_weight_bytes, bytes, sizeof bytes),
                s->decode_weight_bytes * tps / 1e9, info.n_threads);
        if (s->decode_streamed_bytes)
            fprintf(stderr, ", %s of them over PCIe", pshard_format_bytes(s->decode_streamed_bytes, streamed, sizeof streamed));
        fputc('\n', stderr);
        if (s->decode_host_wait_ms > 0)
            fprintf(stderr, "decode step: %.2f ms, of which the host computed its shards, experts and shares of "
                            "attention %.2f ms and waited for the GPU %.2f ms\n",
                    s->decode_ms / (s->n_generated - 1), s->decode_host_compute_ms, s->decode_host_wait_ms);
        if (s->decode_handoffs > 0)
            fprintf(stderr, "hand-offs (GPU clock, per decode step): %d, taking %.2f ms from each layer's input going "
                            "down to the GPU going on (%.1f us each); the GPU worked %.2f ms between them\n",
                    s->decode_handoffs, s->decode_gpu_handoff_ms, s->decode_gpu_handoff_ms * 1e3 / s->decode_handoffs,
                    s->decode_gpu_between_ms);
    }
    if (info.phase_changes > 0)
        fprintf(stderr, "changes of resident set (decode steps over a set of their own, VRAM carved anew): %d so far, "
                        "%.1f ms each\n",
                info.phase_changes, info.phase_change_ms / info.phase_changes);
    if (s->predicted_decode_step_ms > 0)
        fprintf(stderr, "planner's prediction: prompt %.0f ms, decode %.1f tok/s (measured/predicted is learned into "
                        "this machine's profile)\n",
                s->predicted_prefill_ms, 1e3 / s->predicted_decode_step_ms);
}

void cli_measure_end_line(struct cli_measuring *m) {
    if (m->line_open) fputc('\n', stderr);
    m->line_open = false;
}

void cli_measure_progress(void *user, const char *what, double done) {
    struct cli_measuring *m = user;
    if (done < 0) {
        cli_measure_end_line(m); /* a note goes below the progress line */
        fprintf(stderr, "%s: %s\n", m->who, what);
        return;
    }
    fprintf(stderr, "\r%s: %3d%% %-34s", m->label, (int)(100 * done), what);
    m->line_open = done < 1;
    if (done >= 1) fputc('\n', stderr);
}

pshard_ctx *run_open_model(struct run_opts *o) {
    if (!o->model) {
        if (cli_default_model(o->default_path, sizeof o->default_path) != 0) return NULL;
        o->model = o->default_path;
    }
    o->params.model_path = o->model;
    /* One sequence's context is capped here; with many, -c is the cells they share, and each
     * sequence's own reach is capped by the engine. */
    uint32_t n_ctx_train;
    if (o->params.n_ctx > 0 && o->params.n_parallel <= 1 && pshard_model_context(o->model, &n_ctx_train) == PSHARD_OK)
        o->params.n_ctx = cli_cap_context(o->cmd, n_ctx_train, o->params.n_ctx);
    if (!o->quiet && isatty(2))
        o->params.progress = progress_bar, o->gen.on_prompt = prompt_progress, o->gen.on_image = run_image_progress;
    static struct cli_measuring measuring = {.who = "pshard", .label = "measuring this machine for the planner (once, under a minute)"};
    if (!o->quiet) o->params.profile_progress = cli_measure_progress, o->params.progress_user = &measuring;
    pshard_ctx *ctx = NULL;
    if (cli_open(&o->params, o->switches, &ctx) != PSHARD_OK) {
        cli_measure_end_line(&measuring);
        fprintf(stderr, "pshard: %s\n", pshard_last_error());
        return NULL;
    }
    if (o->mmproj && pshard_vision_load(ctx, o->mmproj) != PSHARD_OK) {
        fprintf(stderr, "pshard: %s\n", pshard_last_error());
        pshard_close(ctx);
        return NULL;
    }
    pshard_info info;
    pshard_get_info(ctx, &info);
    if (!o->quiet) {
        char vision[64] = "";
        if (o->mmproj) snprintf(vision, sizeof vision, "; the vision encoder %.2f s", info.load_vision_ms / 1e3);
        const double ms = info.load_file_ms + info.load_plan_ms + info.load_pages_ms + info.load_exec_ms + info.load_vision_ms;
        fprintf(stderr, "load: %.2f s (reading the model %.2f s, planning %.2f s, touching its pages %.2f s, the executor "
                "%.2f s%s)\n", ms / 1e3, info.load_file_ms / 1e3, info.load_plan_ms / 1e3, info.load_pages_ms / 1e3,
                info.load_exec_ms / 1e3, vision);
    }
    if (!o->quiet && info.on_gpu) {
        char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32], many[48] = "";
        const int32_t n = info.predicted_requests;
        if (n > 1) snprintf(many, sizeof many, "for %d requests at once: ", n);
        fprintf(stderr, "VRAM: arena %s = weights %s + KV %s + activations %s + work %s + staging %s; file mapping %s; "
                "CUDA context %s outside the budget; plan %s (predicted %s%s %.2f s for %d-token prompts, %.1f tok/s%s%s)\n",
                pshard_format_bytes(info.vram_arena_bytes, a, sizeof a), pshard_format_bytes(info.vram_weight_bytes, b, sizeof b),
                pshard_format_bytes(info.vram_kv_bytes, c, sizeof c), pshard_format_bytes(info.vram_activation_bytes, d, sizeof d),
                pshard_format_bytes(info.vram_work_bytes, e, sizeof e), pshard_format_bytes(info.vram_staging_bytes, g, sizeof g),
                pshard_format_bytes(info.vram_mapping_bytes, h, sizeof h),
                pshard_format_bytes(info.vram_context_bytes, f, sizeof f), info.plan, many, n > 1 ? "every first token in" : "TTFT",
                info.predicted_ttft_s, info.predicted_prompt_tokens, info.predicted_decode_s > 0 ? n / info.predicted_decode_s : 0.0,
                n > 1 ? " in all" : "", info.profile_measured ? "" : "; from default costs, not a measured profile");
        if (info.n_batch_chosen)
            fprintf(stderr, "micro-batch: %d tokens a prompt step, the planner's choice for this budget (-b N sets it)\n",
                    info.n_batch);
        if (info.vram_follow)
            fprintf(stderr, "VRAM budget %.0f MiB, following free memory and leaving %s to other programs\n",
                    info.vram_budget / 1048576.0, pshard_format_bytes(info.vram_keep, a, sizeof a));
    }
    return ctx;
}

int cmd_run(int argc, char **argv) {
    struct run_opts o;
    int rc = run_parse_args(argc, argv, "run", &o);
    if (rc) return rc > 0 ? 0 : 2;
    if (!(o.switches = cli_switches_read("run"))) return 2;
    if (!o.prompt) {
        fprintf(stderr, "pshard run: a prompt is required (-p TEXT)\n");
        free(o.switches);
        return 2;
    }
    int32_t ids[4096];
    o.gen.out_tokens = ids;
    o.gen.out_tokens_cap = 4096;
    pshard_ctx *ctx = run_open_model(&o);
    free(o.switches);
    if (!ctx) return 1;
    struct cli_budget_watch watch;
    cli_budget_watch_init(&watch, "run", o.budget_file, o.quiet);
    cli_budget_watch_prompts(&watch, ctx, &o.gen);
    pshard_gen_stats stats;
    pshard_status st;
    const pshard_text_cb on_text = print_text;
    /* Images the prompt does not place go before it, one marker each (as llama.cpp's CLI does). */
    char *with_images = NULL;
    if (o.n_images && !strstr(o.prompt, PSHARD_IMAGE_MARKER)) {
        if (!(with_images = cli_with_image_markers(o.prompt, o.n_images))) {
            fprintf(stderr, "pshard: out of memory\n");
            pshard_close(ctx);
            return 1;
        }
        o.prompt = with_images;
    }
    o.gen.images = o.images, o.gen.n_images = o.n_images;
    if (o.raw) {
        st = pshard_generate(ctx, o.prompt, &o.gen, on_text, &watch, &stats);
    } else {
        pshard_message msgs[2] = {{"system", o.system}, {"user", o.prompt}};
        st = o.system ? pshard_chat(ctx, msgs, 2, &o.gen, on_text, &watch, &stats)
                      : pshard_chat(ctx, msgs + 1, 1, &o.gen, on_text, &watch, &stats);
    }
    free(with_images);
    if (st != PSHARD_OK) {
        fprintf(stderr, "pshard: %s\n", pshard_last_error());
        pshard_close(ctx);
        return 1;
    }
    if (o.gen.n_predict != 0) printf("\n");
    if (o.print_ids) {
        printf("ids:");
        for (int32_t i = 0; i < stats.n_generated && i < o.gen.out_tokens_cap; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    if (!o.quiet) run_print_stats(ctx, &stats, o.gen.n_predict, false);
    pshard_close(ctx);
    return 0;
}
