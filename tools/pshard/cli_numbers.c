/* Numbers on the command line, one parser for every subcommand: whole numbers, real numbers,
 * sizes, seeds and comma-separated lists. A bad value is refused with a message that names the
 * option and what it takes; NaN and infinities are never a value. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

/* Digits with an optional sign, nothing else (strtoll alone would take " 12", and strtod "nan"). */
static bool is_whole_number(const char *text) {
    const char *at = text + (*text == '-' || *text == '+');
    if (!*at) return false;
    for (; *at; at++)
        if (*at < '0' || *at > '9') return false;
    return true;
}

/* Digits with at most one decimal point, then nothing or a unit (K, M, G, T, B, as pshard_parse_size
 * reads them; it checks the rest): no sign, space, hexadecimal or exponent, and a count of bytes
 * without a unit is whole. */
static bool is_size_text(const char *text) {
    const char *at = text + strspn(text, "0123456789");
    if (at == text) return false;
    const bool fraction = *at == '.';
    if (fraction) {
        const size_t digits = strspn(at + 1, "0123456789");
        if (!digits) return false;
        at += 1 + digits;
    }
    if (!*at) return !fraction;
    return strchr("kKmMgGtT", *at) || (*at == 'B' && !fraction);
}

/* A size as pshard_parse_size reads it, from text is_size_text accepts. */
static bool read_size(const char *text, int64_t *bytes) {
    return is_size_text(text) && pshard_parse_size(text, bytes) == PSHARD_OK;
}

int cli_needs_value(const char *cmd, const char *opt) {
    fprintf(stderr, "pshard %s: %s needs a value\n", cmd, opt);
    return -1;
}

void cli_refuse(const char *cmd, const char *a, const char *valued) {
    const size_t n = strlen(a);
    for (const char *w = valued; n && (w = strstr(w, a)) != NULL; w += n)
        if ((w == valued || w[-1] == ' ') && (w[n] == ' ' || w[n] == 0)) {
            cli_needs_value(cmd, a);
            return;
        }
    fprintf(stderr, "pshard %s: unknown option '%s'\n", cmd, a);
}

int cli_int(const char *cmd, const char *opt, const char *text, int64_t lo, int64_t hi, int64_t *out) {
    errno = 0;
    const long long v = is_whole_number(text) ? strtoll(text, NULL, 10) : 0;
    if (!is_whole_number(text) || errno || v < lo || v > hi) {
        fprintf(stderr, "pshard %s: %s takes a whole number from %" PRId64 " to %" PRId64 ", got '%s'\n", cmd, opt, lo, hi,
                text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_real(const char *cmd, const char *opt, const char *text, double lo, double hi, bool above_lo, double *out) {
    char *end;
    errno = 0;
    const double v = strtod(text, &end);
    const bool leading_space = *text == ' ' || *text == '\t' || *text == '\n';
    if (leading_space || end == text || *end || errno || !isfinite(v) || v < lo || (above_lo && v == lo) || v > hi) {
        fprintf(stderr, "pshard %s: %s takes a number in %c%g, %g], got '%s'\n", cmd, opt, above_lo ? '(' : '[', lo, hi,
                text);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_size(const char *cmd, const char *opt, const char *text, int64_t *bytes) {
    if (read_size(text, bytes)) return 0;
    fprintf(stderr, "pshard %s: %s takes a size such as 2G, 1536M or 0, got '%s'\n", cmd, opt, text);
    return -1;
}

bool cli_vram_budget(const char *text, int64_t *bytes, int *follow, int64_t *keep_bytes) {
    const char *size = strncmp(text, "auto", 4) ? text : !strncmp(text, "auto:keep=", 10) ? text + 10 : NULL;
    return (!size || is_size_text(size)) && pshard_parse_vram_budget(text, bytes, follow, keep_bytes) == PSHARD_OK;
}

int cli_seed(const char *cmd, const char *text, uint64_t *seed, bool *drawn) {
    *drawn = !strcmp(text, "-1");
    if (*drawn) {
        if (getrandom(seed, sizeof *seed, 0) != (ssize_t)sizeof *seed) /* no entropy source: the clock */
            *seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
        return 0;
    }
    errno = 0;
    const unsigned long long v = text[0] != '-' && is_whole_number(text) ? strtoull(text, NULL, 10) : 0;
    if (text[0] == '-' || !is_whole_number(text) || errno) {
        fprintf(stderr, "pshard %s: --seed takes a whole number from 0 to %" PRIu64 ", or -1 for a random one, got '%s'\n",
                cmd, UINT64_MAX, text);
        return -1;
    }
    *seed = v;
    return 0;
}

int cli_parse_list(const char *text, bool sizes, int64_t *out, int max, int *n) {
    *n = 0;
    for (const char *at = text;; at++) {
        const char *comma = strchr(at, ',');
        const size_t len = comma ? (size_t)(comma - at) : strlen(at);
        char item[64];
        if (len == 0 || len >= sizeof item || *n == max) return -1; /* empty, long, or one too many */
        memcpy(item, at, len);
        item[len] = 0;
        int64_t v;
        if (sizes) {
            if (!read_size(item, &v) || v <= 0) return -1;
        } else {
            errno = 0;
            v = is_whole_number(item) ? strtoll(item, NULL, 10) : 0;
            if (errno || v <= 0 || v > (1 << 24)) return -1;
        }
        out[(*n)++] = v;
        if (!comma) return 0;
        at = comma;
    }
}

int32_t cli_request_tokens(long long n) { return n < 0 ? INT32_MAX : n < 1 ? 1 : n > INT32_MAX ? INT32_MAX : (int32_t)n; }
