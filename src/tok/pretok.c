/* Pre-tokenizers of byte-level BPE models: before merging, text is cut into pieces by a short
 * sequence of regular expressions chosen by tokenizer.ggml.pre. Each pattern splits every
 * piece the previous one made, keeping both the matches and the text between them ("Isolated"
 * in HF tokenizers), so merges never cross a piece boundary.
 *
 * The patterns are facts taken from the models' HF tokenizer.json files (as also listed by
 * llama.cpp); PCRE2 runs them with Unicode properties (UTF + UCP) and JIT. */
#include "tok/tok_internal.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

/* GPT-2's split, as the HF ByteLevel pre-tokenizer (use_regex) applies it. */
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
/* Llama 3 (cl100k-like): letters may take one leading non-letter, digits in runs of up to 3. */
#define RE_LLAMA3                                                                                \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Qwen2: as Llama 3 but every digit alone. */
#define RE_QWEN2                                                                                 \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|" \
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* Mistral Tekken: words split at lower->upper case changes. */
#define RE_TEKKEN                                                                                \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"       \
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"       \
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_BLOOM " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"
#define RE_CJK_HANGUL "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"

struct pretok_def {
    const char *names[8]; /* tokenizer.ggml.pre values that mean this split */
    const char *patterns[TOK_MAX_PATTERNS];
    bool ignore_merges;
    bool add_bos_default;
};

static const struct pretok_def pretok_defs[] = {
    {{"gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "roberta-bpe"}, {RE_GPT2}, false, false},
    /* llama.cpp's "default": punctuation and digit runs split off before GPT-2's split. */
    {{"default"},
     {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"},
     false,
     false},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {RE_LLAMA3}, true, true},
    {{"dbrx", "smaug-bpe", "chatglm-bpe"}, {RE_LLAMA3}, false, false},
    {{"qwen2", "stablelm2", "megrez"}, {RE_QWEN2}, false, false},
    /* HF: Digits(individual_digits) then ByteLevel(use_regex). */
    {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"},
     {"\\p{N}", RE_GPT2},
     false,
     false},
    {{"deepseek-llm"},
     {"[\\r\\n]",
      "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}"
      "\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}"
      "\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}"
      "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}"
      "\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}"
      "\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}"
      "\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}"
      "\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}"
      "\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}\\x{210A}-\\x{2113}"
      "\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}"
      "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}"
      "\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}"
      "\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}"
      "\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
      "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}"
      "\\x{1E900}-\\x{1E943}]+",
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
      "\\s+$",
      RE_CJK_HANGUL,
      "\\p{N}+"},
     false,
     false},
    {{"deepseek-coder"},
     {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", RE_CJK_HANGUL, "\\p{N}"},
     false,
     false},
    {{"deepseek-v3"},
     {"\\p{N}{1,3}", "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+",
      "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
      " ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
     false,
     false},
    {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"}, false, false},
    {{"tekken"}, {RE_TEKKEN}, true, true},
    {{"bloom", "poro-chat", "gpt3-finnish"}, {RE_BLOOM}, false, false},
    {{"viking"}, {RE_BLOOM, "\\p{N}"}, false, false},
};

static const struct pretok_def *pretok_lookup(const char *name) {
    if (!name) return NULL;
    for (size_t d = 0; d < sizeof pretok_defs / sizeof pretok_defs[0]; d++)
        for (int i = 0; i < 8 && pretok_defs[d].names[i]; i++)
            if (strcmp(pretok_defs[d].names[i], name) == 0) return &pretok_defs[d];
    return NULL;
}

bool pretok_adds_bos(const char *name) {
    const struct pretok_def *def = pretok_lookup(name);
    return def && def->add_bos_default;
}

pshard_status pretok_init(struct pretok *pre, const char *name) {
    memset(pre, 0, sizeof *pre);
    const struct pretok_def *def = pretok_lookup(name);
    if (!def) {
        LOG_W("tokenizer: %s pre-tokenizer%s%s%s, using the GPT-2 split; tokens may differ from "
              "the model's own tokenizer",
              name ? "unknown" : "no", name ? " '" : "", name ? name : "", name ? "'" : "");
        def = &pretok_defs[0];
    }
    pre->name = def->names[0];
    pre->ignore_merges = def->ignore_merges;
    for (int i = 0; i < TOK_MAX_PATTERNS && def->patterns[i]; i++) {
        int err = 0;
        PCRE2_SIZE err_at = 0;
        pcre2_code *code = pcre2_compile((PCRE2_SPTR)def->patterns[i], PCRE2_ZERO_TERMINATED,
                                         PCRE2_UTF | PCRE2_UCP, &err, &err_at, NULL);
        if (!code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            pretok_free(pre);
            return core_fail(PSHARD_ERR_INTERNAL, "pre-tokenizer '%s' pattern %d: %s at %zu",
                             def->names[0], i, (const char *)msg, (size_t)err_at);
        }
        /* Without JIT (unsupported CPU) the interpreter gives the same matches, only slower. */
        (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
        pre->code[pre->n_patterns++] = code;
    }
    return PSHARD_OK;
}

void pretok_free(struct pretok *pre) {
    for (int i = 0; i < pre->n_patterns; i++) pcre2_code_free(pre->code[i]);
    pre->n_patterns = 0;
}

/* Visits the pieces pattern `level` (and the ones after it) cut text into. */
static pshard_status split_level(const struct pretok *pre, pcre2_match_data *md, int level,
                                 const char *text, size_t len, pretok_visit_fn visit, void *ctx) {
    if (len == 0) return PSHARD_OK;
    if (level == pre->n_patterns) return visit(ctx, text, len);
    const pcre2_code *code = pre->code[level];
    size_t pos = 0; /* end of what has been visited */
    size_t from = 0;
    while (from < len) {
        /* NOTEMPTY: none of the patterns means to match empty, and it guarantees progress. */
        int rc = pcre2_match(code, (PCRE2_SPTR)text, len, from, PCRE2_NO_UTF_CHECK | PCRE2_NOTEMPTY,
                             md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return core_fail(PSHARD_ERR_INTERNAL, "pre-tokenizer '%s': %s", pre->name,
                             (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t start = ov[0], end = ov[1];
        /* The recursion below reuses md, so the offsets are read first. */
        CORE_TRY(split_level(pre, md, level + 1, text + pos, start - pos, visit, ctx));
        CORE_TRY(split_level(pre, md, level + 1, text + start, end - start, visit, ctx));
        pos = from = end;
    }
    return split_level(pre, md, level + 1, text + pos, len - pos, visit, ctx);
}

pshard_status pretok_split(const struct pretok *pre, struct tok_scratch *scratch, const char *text,
                           size_t len, pretok_visit_fn visit, void *ctx) {
    if (!scratch->match_data) {
        scratch->match_data = pcre2_match_data_create(16, NULL);
        if (!scratch->match_data) return core_fail(PSHARD_ERR_NOMEM, "no memory for regex match data");
    }
    return split_level(pre, scratch->match_data, 0, text, len, visit, ctx);
}

void tok_scratch_free(struct tok_scratch *s) {
    if (s->match_data) pcre2_match_data_free(s->match_data);
    free(s->sym_id);
    free(s->sym_len);
    free(s->prev);
    free(s->next);
    free(s->heap);
    free(s->buf);
    memset(s, 0, sizeof *s);
}
