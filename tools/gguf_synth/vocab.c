/* A small, working byte-level BPE vocabulary: the 256 byte tokens in GPT-2's byte-to-unicode
 * mapping, merges learned here by plain BPE training on a list of common English words, the
 * ChatML control tokens, and unused filler tokens up to the model's vocabulary size. Because
 * every byte is a token, any text tokenizes; because the merges are learned, each merge's two
 * parts and its result are tokens. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth.h"

/* Common English words, most frequent first (the weight of a word falls as 1/rank). */
static const char *const english_words[] = {
    "the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has",
    "there", "been", "if", "more", "when", "will", "would", "who", "so", "no", "she", "other",
    "its", "may", "these", "what", "them", "than", "some", "him", "time", "into", "only", "do",
    "could", "new", "about", "two", "then", "first", "also", "any", "like", "our", "people",
    "my", "made", "out", "up", "over", "after", "many", "most", "did", "very", "your", "should",
    "such", "where", "how", "must", "those", "before", "well", "through", "because", "each",
    "much", "between", "even", "world", "just", "work", "three", "years", "own", "life",
    "under", "make", "same", "being", "while", "here", "used", "day", "way", "part", "still",
    "good", "might", "see", "great", "again", "system", "state", "long", "last", "never",
    "number", "house", "water", "without", "place", "thought", "during", "found", "small",
    "against", "take", "going", "know", "something", "every", "since", "government", "case",
    "year", "general", "point", "come", "school", "large", "important", "high", "often",
    "however", "form", "group", "possible", "another", "both", "information", "think", "given",
    "different", "public", "right", "back", "those", "less", "old", "children", "family",
    "model", "language", "question", "example", "hello", "answer", "data", "program", "user",
    "assistant", "system", "function", "value", "return", "string", "memory", "computer",
    "because", "following", "called", "around", "going", "looking", "running", "working",
    "developed", "provided", "started", "interesting", "nothing", "everything", "together",
    "already", "always", "city", "country", "history", "power", "business", "money", "company",
    "service", "problem", "order", "level", "within", "local", "result", "change", "health",
    "process", "development", "research", "student", "science", "energy", "market", "book",
    "story", "words", "letter", "light", "night", "morning", "friend", "mother", "father",
    "brown", "quick", "jumps", "lazy", "fox", "dog", "cat", "tree", "river", "sun", "moon",
    "once", "upon", "king", "little", "girl", "boy", "happy", "said", "asked", "told", "went",
    "came", "looked", "wanted", "please", "thank", "yes", "today", "tomorrow", "question",
    "reason", "national", "international", "understand", "experience", "especially",
    "something", "sometimes", "everyone", "anything", "whether", "although", "rather",
};

/* Fragments that are whole pre-tokens in GPT-2-style splitting: contractions, whitespace
 * runs, common punctuation and numbers. */
static const char *const extra_pretokens[] = {
    "'s", "'t", "'re", "'ve", "'ll", "'d", "'m", "  ", "   ", "    ", "        ", "\n\n",
    ".\n", ".\n\n", "...", " (", ").", "),", " \"", ".\"", ",\"", " 10", " 100", " 2024",
    " 1000", " 19", " 20", "://", " {", " }", " =", " ==", " ->", "();",
};

enum { N_SPECIAL = 3, MAX_WORD_SYMBOLS = 40 };

struct raw_token {
    uint8_t *bytes;
    size_t len;
};

struct train_word {
    uint32_t sym[MAX_WORD_SYMBOLS];
    uint32_t n;
    uint64_t freq;
};

struct trainer {
    struct raw_token *tokens;
    size_t n_tokens, max_tokens;
    struct train_word *words;
    size_t n_words, cap_words;
    uint32_t (*merges)[2];
    size_t n_merges, cap_merges;
    bool failed;
};

/* GPT-2's byte-to-unicode map: printable bytes stand for themselves, the other 68 bytes are
 * shifted to code points 256 and up, so every byte has a visible character. */
static uint32_t byte_code_point(uint8_t b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174) return b;
    uint32_t n = 0;
    for (uint32_t c = 0; c < b; c++)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174)) n++;
    return 256 + n;
}

static void add_word(struct trainer *tr, const char *text, uint64_t freq, const uint32_t *byte_id) {
    size_t len = strlen(text);
    if (len == 0 || len > MAX_WORD_SYMBOLS || tr->failed) return;
    if (tr->n_words == tr->cap_words) {
        size_t cap = tr->cap_words ? tr->cap_words * 2 : 1024;
        struct train_word *grown = realloc(tr->words, cap * sizeof *grown);
        if (!grown) {
            tr->failed = true;
            return;
        }
        tr->words = grown;
        tr->cap_words = cap;
    }
    struct train_word *w = &tr->words[tr->n_words++];
    w->n = (uint32_t)len;
    w->freq = freq;
    for (size_t i = 0; i < len; i++) w->sym[i] = byte_id[(uint8_t)text[i]];
}

/* Pair counts live in an open-addressing table, cleared each round. */
struct pair_slot {
    uint64_t key; /* (left << 32 | right) + 1; 0 marks an empty slot */
    uint64_t freq;
};

static bool best_pair(struct trainer *tr, struct pair_slot *table, size_t mask, uint32_t *left,
                      uint32_t *right) {
    memset(table, 0, (mask + 1) * sizeof *table);
    uint64_t best_key = 0, best_freq = 0;
    for (size_t wi = 0; wi < tr->n_words; wi++) {
        const struct train_word *w = &tr->words[wi];
        for (uint32_t i = 0; i + 1 < w->n; i++) {
            const uint64_t key = ((uint64_t)w->sym[i] << 32 | w->sym[i + 1]) + 1;
            size_t h = (size_t)((key * 0x9e3779b97f4a7c15ull) >> 40) & mask;
            while (table[h].key != 0 && table[h].key != key) h = (h + 1) & mask;
            table[h].key = key;
            table[h].freq += w->freq;
            const uint64_t f = table[h].freq;
            if (f > best_freq || (f == best_freq && key < best_key)) {
                best_freq = f;
                best_key = key;
            }
        }
    }
    if (best_freq == 0) return false;
    *left = (uint32_t)((best_key - 1) >> 32);
    *right = (uint32_t)(best_key - 1);
    return true;
}

/* The id of the token with these bytes, adding it if new; UINT32_MAX when full. */
static uint32_t token_for(struct trainer *tr, const struct raw_token *a, const struct raw_token *b) {
    const size_t len = a->len + b->len;
    for (size_t i = 256; i < tr->n_tokens; i++) {
        const struct raw_token *t = &tr->tokens[i];
        if (t->len == len && !memcmp(t->bytes, a->bytes, a->len) &&
            !memcmp(t->bytes + a->len, b->bytes, b->len))
            return (uint32_t)i;
    }
    if (tr->n_tokens >= tr->max_tokens) return UINT32_MAX;
    uint8_t *bytes = malloc(len);
    if (!bytes) {
        tr->failed = true;
        return UINT32_MAX;
    }
    memcpy(bytes, a->bytes, a->len);
    memcpy(bytes + a->len, b->bytes, b->len);
    tr->tokens[tr->n_tokens] = (struct raw_token){bytes, len};
    return (uint32_t)tr->n_tokens++;
}

static void apply_merge(struct trainer *tr, uint32_t left, uint32_t right, uint32_t merged) {
    for (size_t wi = 0; wi < tr->n_words; wi++) {
        struct train_word *w = &tr->words[wi];
        uint32_t out = 0;
        for (uint32_t i = 0; i < w->n; i++) {
            if (i + 1 < w->n && w->sym[i] == left && w->sym[i + 1] == right) {
                w->sym[out++] = merged;
                i++;
            } else {
                w->sym[out++] = w->sym[i];
            }
        }
        w->n = out;
    }
}

static void train(struct trainer *tr) {
    size_t n_pairs = 0;
    for (size_t i = 0; i < tr->n_words; i++) n_pairs += tr->words[i].n;
    size_t slots = 1024;
    while (slots < 4 * n_pairs) slots *= 2;
    struct pair_slot *table = malloc(slots * sizeof *table);
    if (!table) {
        tr->failed = true;
        return;
    }
    uint32_t left, right;
    while (!tr->failed && best_pair(tr, table, slots - 1, &left, &right)) {
        const uint32_t merged = token_for(tr, &tr->tokens[left], &tr->tokens[right]);
        if (merged == UINT32_MAX) break;
        if (tr->n_merges == tr->cap_merges) {
            size_t cap = tr->cap_merges ? tr->cap_merges * 2 : 1024;
            uint32_t(*grown)[2] = realloc(tr->merges, cap * sizeof *grown);
            if (!grown) {
                tr->failed = true;
                break;
            }
            tr->merges = grown;
            tr->cap_merges = cap;
        }
        tr->merges[tr->n_merges][0] = left;
        tr->merges[tr->n_merges][1] = right;
        tr->n_merges++;
        apply_merge(tr, left, right, merged);
    }
    free(table);
}

/* Byte-level text of raw bytes: each byte as the UTF-8 of its code point. */
static char *byte_level_text(const uint8_t *bytes, size_t len, const char *between,
                             const uint8_t *more, size_t more_len) {
    char *s = malloc(2 * (len + more_len) + strlen(between) + 1), *p = s;
    if (!s) return NULL;
    for (int part = 0; part < 2; part++) {
        const uint8_t *b = part ? more : bytes;
        const size_t n = part ? more_len : len;
        if (part) p += sprintf(p, "%s", between);
        for (size_t i = 0; i < n; i++) {
            const uint32_t cp = byte_code_point(b[i]);
            if (cp < 0x80) {
                *p++ = (char)cp;
            } else {
                *p++ = (char)(0xc0 | (cp >> 6));
                *p++ = (char)(0x80 | (cp & 0x3f));
            }
        }
    }
    *p = '\0';
    return s;
}

static pshard_status vocab_from_trainer(struct synth_vocab *vocab, const struct trainer *tr,
                                        uint32_t n_vocab) {
    vocab->n_tokens = n_vocab;
    vocab->tokens = calloc(n_vocab, sizeof *vocab->tokens);
    vocab->types = calloc(n_vocab, sizeof *vocab->types);
    vocab->n_merges = tr->n_merges;
    vocab->merges = calloc(tr->n_merges + 1, sizeof *vocab->merges);
    if (!vocab->tokens || !vocab->types || !vocab->merges) goto nomem;
    for (size_t i = 0; i < tr->n_tokens; i++) {
        vocab->tokens[i] = byte_level_text(tr->tokens[i].bytes, tr->tokens[i].len, "", NULL, 0);
        vocab->types[i] = SYNTH_TOKEN_NORMAL;
        if (!vocab->tokens[i]) goto nomem;
    }
    static const char *const specials[N_SPECIAL] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    uint32_t id = (uint32_t)tr->n_tokens;
    vocab->id_endoftext = id;
    vocab->id_im_start = id + 1;
    vocab->id_im_end = id + 2;
    for (int i = 0; i < N_SPECIAL; i++, id++) {
        vocab->tokens[id] = strdup(specials[i]);
        vocab->types[id] = SYNTH_TOKEN_CONTROL;
        if (!vocab->tokens[id]) goto nomem;
    }
    /* Fillers: unique names no merge can produce (the training words have no brackets). */
    for (; id < n_vocab; id++) {
        char name[32];
        snprintf(name, sizeof name, "[PAD%u]", id);
        vocab->tokens[id] = strdup(name);
        vocab->types[id] = SYNTH_TOKEN_UNUSED;
        if (!vocab->tokens[id]) goto nomem;
    }
    for (size_t i = 0; i < tr->n_merges; i++) {
        const struct raw_token *a = &tr->tokens[tr->merges[i][0]], *b = &tr->tokens[tr->merges[i][1]];
        vocab->merges[i] = byte_level_text(a->bytes, a->len, " ", b->bytes, b->len);
        if (!vocab->merges[i]) goto nomem;
    }
    return PSHARD_OK;
nomem:
    synth_vocab_free(vocab);
    return core_fail(PSHARD_ERR_NOMEM, "out of memory building the vocabulary");
}

pshard_status synth_vocab_build(struct synth_vocab *vocab, uint32_t n_vocab) {
    memset(vocab, 0, sizeof *vocab);
    if (n_vocab < 256 + N_SPECIAL)
        return core_fail(PSHARD_ERR_RANGE, "vocabulary size %u is too small: it needs at least %d "
                         "tokens (256 bytes and %d control tokens)", n_vocab, 256 + N_SPECIAL, N_SPECIAL);
    /* Leave 1/64 of the ids (as far as the byte tokens allow) to unused fillers, so every
     * vocabulary has some. */
    const uint32_t room = n_vocab - 256 - N_SPECIAL;
    const uint32_t n_fillers = n_vocab / 64 < room ? n_vocab / 64 : room;
    struct trainer tr = {.max_tokens = n_vocab - N_SPECIAL - n_fillers}; /* >= 256 */
    tr.tokens = calloc(tr.max_tokens, sizeof *tr.tokens);
    pshard_status status = PSHARD_OK;
    if (!tr.tokens) return core_fail(PSHARD_ERR_NOMEM, "out of memory building the vocabulary");

    /* Byte tokens in code point order, as GPT-2 and Qwen number them. */
    uint32_t byte_id[256];
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t id = 0;
        for (uint32_t c = 0; c < 256; c++) id += byte_code_point((uint8_t)c) < byte_code_point((uint8_t)b);
        byte_id[b] = id;
        uint8_t *bytes = malloc(1);
        if (!bytes) {
            tr.failed = true;
            break;
        }
        bytes[0] = (uint8_t)b;
        tr.tokens[id] = (struct raw_token){bytes, 1};
    }
    tr.n_tokens = 256;

    /* A word mostly follows a space (" the"); sometimes it starts a line or is capitalized. */
    const size_t n_english = sizeof english_words / sizeof english_words[0];
    for (size_t i = 0; i < n_english && !tr.failed; i++) {
        const uint64_t freq = 1000000 / (i + 10);
        char text[64];
        snprintf(text, sizeof text, " %s", english_words[i]);
        add_word(&tr, text, freq, byte_id);
        add_word(&tr, english_words[i], freq / 8, byte_id);
        text[1] = (char)(text[1] - 'a' + 'A');
        add_word(&tr, text, freq / 8, byte_id);
        add_word(&tr, text + 1, freq / 16, byte_id); /* "The" at the start of a text */
    }
    const size_t n_extra = sizeof extra_pretokens / sizeof extra_pretokens[0];
    for (size_t i = 0; i < n_extra; i++) add_word(&tr, extra_pretokens[i], 20000, byte_id);

    if (!tr.failed) train(&tr);
    if (tr.failed) status = core_fail(PSHARD_ERR_NOMEM, "out of memory building the vocabulary");
    else status = vocab_from_trainer(vocab, &tr, n_vocab);

    for (size_t i = 0; i < tr.n_tokens; i++) free(tr.tokens[i].bytes);
    free(tr.tokens);
    free(tr.words);
    free(tr.merges);
    return status;
}

pshard_status synth_vocab_add_vision(struct synth_vocab *vocab) {
    static const char *const names[] = {"<|vision_start|>", "<|vision_end|>", "<|image_pad|>"};
    size_t done = 0;
    for (size_t id = 0; id < vocab->n_tokens && done < sizeof names / sizeof names[0]; id++) {
        if (vocab->types[id] != SYNTH_TOKEN_UNUSED) continue;
        char *name = strdup(names[done]);
        if (!name) return core_fail(PSHARD_ERR_NOMEM, "out of memory building the vocabulary");
        free(vocab->tokens[id]);
        vocab->tokens[id] = name;
        vocab->types[id] = SYNTH_TOKEN_CONTROL;
        done++;
    }
    if (done < sizeof names / sizeof names[0])
        return core_fail(PSHARD_ERR_RANGE, "the vocabulary has no room for the vision tokens");
    return PSHARD_OK;
}

void synth_vocab_free(struct synth_vocab *vocab) {
    if (vocab->tokens)
        for (size_t i = 0; i < vocab->n_tokens; i++) free(vocab->tokens[i]);
    if (vocab->merges)
        for (size_t i = 0; i < vocab->n_merges; i++) free(vocab->merges[i]);
    free(vocab->tokens);
    free(vocab->types);
    free(vocab->merges);
    memset(vocab, 0, sizeof *vocab);
}
