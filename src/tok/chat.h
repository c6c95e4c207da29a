/* Chat templates: the prompt format of the model families pshard ships or benchmarks,
 * recognized from the GGUF's tokenizer.chat_template (we do not run Jinja; we recognize the
 * family and format it in C). */
#ifndef TOK_CHAT_H
#define TOK_CHAT_H

#include <stddef.h>

#include "pshard.h"

enum chat_format {
    CHAT_NONE,    /* no template: the text is used as it is */
    CHAT_CHATML,  /* <|im_start|>role\n...<|im_end|>\n (SmolLM2, Qwen) */
    CHAT_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    CHAT_MISTRAL, /* [INST] ... [/INST] ...</s> */
};

struct chat_template {
    enum chat_format format;
    char default_system[512]; /* a system prompt the template inserts when none is given */
    int use_default_system;   /* insert it (off by default: small models answer worse with it) */
    int mistral_spaces;       /* "[INST] text [/INST]" (v1) rather than "[INST]text[/INST]" */
};

struct chat_message {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
};

/* Recognize the family of a Jinja template text (NULL or unrecognized: CHAT_NONE). */
void chat_template_detect(const char *jinja, size_t len, struct chat_template *out);

const char *chat_format_name(enum chat_format format);

/* Format messages, ending with the assistant's turn opened when add_generation_prompt.
 * Writes at most cap bytes (NUL included); *needed is the full length without the NUL.
 * PSHARD_ERR_RANGE when it does not fit. BOS is not written: the tokenizer adds it. */
pshard_status chat_format_messages(const struct chat_template *tpl, const struct chat_message *msgs, size_t n,
                                   int add_generation_prompt, char *out, size_t cap, size_t *needed);

#endif
