/* Chat template recognition and formatting for ChatML, Llama 3 and Mistral families. */
#include "tok/chat.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"

const char *chat_format_name(enum chat_format format) {
    switch (format) {
    case CHAT_CHATML: return "chatml";
    case CHAT_LLAMA3: return "llama3";
    case CHAT_MISTRAL: return "mistral";
    case CHAT_NONE: break;
    }
    return "none";
}

static const char *find_in(const char *hay, size_t len, const char *needle) {
    return memmem(hay, len, needle, strlen(needle));
}

/* A ChatML template that inserts a fixed system message when the conversation has none
 * (SmolLM2, Qwen 2.5) spells it as a literal: '<|im_start|>system\n...<|im_end|>'. */
static void chatml_default_system(const char *jinja, size_t len, struct chat_template *out) {
    const char *marker = "<|im_start|>system\n";
    const char *p = find_in(jinja, len, marker);
    while (p) {
        const char *text = p + strlen(marker);
        const size_t rest = len - (size_t)(text - jinja);
        const char *end = find_in(text, rest, "<|im_end|>");
        const size_t n = end ? (size_t)(end - text) : 0;
        if (end && n > 0 && n < sizeof out->default_system && !memchr(text, '{', n) && !memchr(text, '\'', n) &&
            !memchr(text, '+', n)) {
            memcpy(out->default_system, text, n);
            out->default_system[n] = '\0';
            return;
        }
        p = find_in(text, rest, marker);
    }
}

void chat_template_detect(const char *jinja, size_t len, struct chat_template *out) {
    memset(out, 0, sizeof *out);
    if (!jinja || len == 0) return;
    if (find_in(jinja, len, "<|im_start|>")) {
        out->format = CHAT_CHATML;
        chatml_default_system(jinja, len, out);
    } else if (find_in(jinja, len, "<|start_header_id|>")) {
        out->format = CHAT_LLAMA3;
    } else if (find_in(jinja, len, "[INST]")) {
        out->format = CHAT_MISTRAL;
        out->mistral_spaces = find_in(jinja, len, "[INST] ") != NULL;
    }
}

struct writer {
    char *out;
    size_t cap, len;
};

static void put(struct writer *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct writer *w, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = w->len < w->cap ? w->cap - w->len : 0;
    int n = vsnprintf(room ? w->out + w->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0) w->len += (size_t)n;
}

static void format_chatml(const struct chat_template *tpl, const struct chat_message *m, size_t n, int gen,
                          struct writer *w) {
    if (tpl->use_default_system && tpl->default_system[0] && (n == 0 || strcmp(m[0].role, "system") != 0))
        put(w, "<|im_start|>system\n%s<|im_end|>\n", tpl->default_system);
    for (size_t i = 0; i < n; i++) put(w, "<|im_start|>%s\n%s<|im_end|>\n", m[i].role, m[i].content);
    if (gen) put(w, "<|im_start|>assistant\n");
}

static void format_llama3(const struct chat_message *m, size_t n, int gen, struct writer *w) {
    for (size_t i = 0; i < n; i++)
        put(w, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", m[i].role, m[i].content);
    if (gen) put(w, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Mistral has no system role: a system message is prefixed to the next user message. */
static void format_mistral(const struct chat_template *tpl, const struct chat_message *m, size_t n, struct writer *w) {
    const char *system = NULL;
    const char *sp = tpl->mistral_spaces ? " " : "";
    for (size_t i = 0; i < n; i++) {
        if (!strcmp(m[i].role, "system")) {
            system = m[i].content;
        } else if (!strcmp(m[i].role, "user")) {
            if (system) put(w, "[INST]%s%s\n\n%s%s[/INST]", sp, system, m[i].content, sp);
            else put(w, "[INST]%s%s%s[/INST]", sp, m[i].content, sp);
            system = NULL;
        } else {
            put(w, "%s%s</s>", sp, m[i].content);
        }
    }
}

pshard_status chat_format_messages(const struct chat_template *tpl, const struct chat_message *msgs, size_t n,
                                   int add_generation_prompt, char *out, size_t cap, size_t *needed) {
    struct writer w = {out, cap, 0};
    if (cap) out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        if (!msgs[i].role || !msgs[i].content)
            return core_fail(PSHARD_ERR_INVALID_ARG, "chat message %zu has no role or content", i);
    switch (tpl->format) {
    case CHAT_CHATML: format_chatml(tpl, msgs, n, add_generation_prompt, &w); break;
    case CHAT_LLAMA3: format_llama3(msgs, n, add_generation_prompt, &w); break;
    case CHAT_MISTRAL: format_mistral(tpl, msgs, n, &w); break;
    case CHAT_NONE:
        for (size_t i = 0; i < n; i++) put(&w, "%s%s", i ? "\n" : "", msgs[i].content);
        break;
    }
    *needed = w.len;
    if (w.len >= cap) return core_fail(PSHARD_ERR_RANGE, "formatted chat needs %zu bytes", w.len + 1);
    return PSHARD_OK;
}
