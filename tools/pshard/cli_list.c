/* Numbers on the command line: comma-separated lists (`pshard bench --budgets`, `pshard plan --tokens`), -n. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "plan/plan.h"

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
            if (plan_parse_size(item, &v) != PSHARD_OK || v <= 0) return -1;
        } else {
            char *end;
            errno = 0;
            v = strtoll(item, &end, 10);
            if (errno || end == item || *end || v <= 0 || v > (1 << 24)) return -1;
        }
        out[(*n)++] = v;
        if (!comma) return 0;
        at = comma;
    }
}

int32_t cli_request_tokens(long long n) { return n < 0 ? INT32_MAX : n < 1 ? 1 : n > INT32_MAX ? INT32_MAX : (int32_t)n; }
