/* GGUF reader: valid files of every metadata type, split models, and a corpus of malformed
 * files that must each fail with a message naming the file and the problem. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "gguf/gguf.h"
#include "test_helpers.h"

static struct gguf_file *open_ok(const char *name) {
    struct gguf_file *f = NULL;
    pshard_status st = gguf_open(test_data_path(name), &f);
    if (st != PSHARD_OK) fail_msg("opening %s: %s", name, pshard_last_error());
    return f;
}

static void test_all_metadata_types(void **state) {
    (void)state;
    struct gguf_file *f = open_ok("gguf/valid_v3_all_types.gguf");
    assert_int_equal(gguf_version(f), 3);
    assert_int_equal(gguf_alignment(f), 32);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f32;
    bool b;
    struct gguf_str s;
    assert_int_equal(gguf_get_u32(f, "t.u8", &u32), PSHARD_OK);
    assert_int_equal(u32, 200);
    assert_int_equal(gguf_get_i64(f, "t.i8", &i64), PSHARD_OK);
    assert_int_equal(i64, -100);
    assert_int_equal(gguf_get_u32(f, "t.u16", &u32), PSHARD_OK);
    assert_int_equal(u32, 60000);
    assert_int_equal(gguf_get_i64(f, "t.i16", &i64), PSHARD_OK);
    assert_int_equal(i64, -30000);
    assert_int_equal(gguf_get_u32(f, "t.u32", &u32), PSHARD_OK);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(gguf_get_i64(f, "t.i32", &i64), PSHARD_OK);
    assert_int_equal(i64, -2000000000);
    assert_int_equal(gguf_get_f32(f, "t.f32", &f32), PSHARD_OK);
    assert_true(f32 == 1.5f);
    assert_int_equal(gguf_get_bool(f, "t.bool", &b), PSHARD_OK);
    assert_true(b);
    assert_int_equal(gguf_get_str(f, "t.str", &s), PSHARD_OK);
    assert_true(gguf_str_eq(s, "héllo wörld"));
    assert_int_equal(gguf_get_u64(f, "t.u64", &u64), PSHARD_OK);
    assert_true(u64 == (1ull << 63) + 5);
    assert_int_equal(gguf_get_i64(f, "t.i64", &i64), PSHARD_OK);
    assert_true(i64 == -(1ll << 62));
    assert_int_equal(gguf_get_f32(f, "t.f64", &f32), PSHARD_OK);
    assert_true(f32 == 2.25f);

    /* Conversions that do not fit, wrong kinds and missing keys are errors, not garbage. */
    assert_int_equal(gguf_get_u32(f, "t.i8", &u32), PSHARD_ERR_FORMAT);
    assert_int_equal(gguf_get_u32(f, "t.u64", &u32), PSHARD_ERR_FORMAT);
    assert_int_equal(gguf_get_i64(f, "t.u64", &i64), PSHARD_ERR_FORMAT);
    assert_int_equal(gguf_get_str(f, "t.u32", &s), PSHARD_ERR_FORMAT);
    assert_non_null(strstr(pshard_last_error(), "t.u32"));
    assert_int_equal(gguf_get_f32(f, "t.str", &f32), PSHARD_ERR_FORMAT);
    assert_int_equal(gguf_get_bool(f, "t.u8", &b), PSHARD_ERR_FORMAT);
    assert_int_equal(gguf_get_u32(f, "no.such.key", &u32), PSHARD_ERR_NOT_FOUND);
    assert_non_null(strstr(pshard_last_error(), "no.such.key"));

    struct gguf_array a;
    assert_int_equal(gguf_get_array(f, "t.arr_i32", &a), PSHARD_OK);
    assert_int_equal(a.n, 3);
    assert_int_equal(gguf_array_int(&a, 0), 1);
    assert_int_equal(gguf_array_int(&a, 1), -2);
    assert_int_equal(gguf_array_int(&a, 2), 3);
    assert_int_equal(gguf_array_int(&a, 3), 0); /* out of range reads nothing */
    assert_int_equal(gguf_get_array(f, "t.arr_f32", &a), PSHARD_OK);
    assert_true(gguf_array_float(&a, 1) == 1.5);
    assert_int_equal(gguf_get_array(f, "t.arr_bool", &a), PSHARD_OK);
    assert_int_equal(gguf_array_int(&a, 0), 1);
    assert_int_equal(gguf_get_array(f, "t.arr_u64", &a), PSHARD_OK);
    assert_true(gguf_array_int(&a, 0) == (1ll << 40));
    assert_int_equal(gguf_get_array(f, "t.arr_empty", &a), PSHARD_OK);
    assert_int_equal(a.n, 0);
    assert_int_equal(gguf_get_array(f, "t.arr_str", &a), PSHARD_OK);
    struct gguf_str *strings;
    assert_int_equal(gguf_array_strings(&a, &strings), PSHARD_OK);
    assert_true(gguf_str_eq(strings[0], "a"));
    assert_true(gguf_str_eq(strings[1], ""));
    assert_true(gguf_str_eq(strings[2], "ccc"));
    free(strings);
    assert_int_equal(gguf_get_array(f, "t.arr_i32", &a), PSHARD_OK);
    assert_int_equal(gguf_array_strings(&a, &strings), PSHARD_ERR_FORMAT);
    assert_int_equal(gguf_get_array(f, "t.u8", &a), PSHARD_ERR_FORMAT);

    assert_int_equal(gguf_tensor_count(f), 2);
    const struct gguf_tensor *t = gguf_find_tensor(f, "b.weight");
    assert_non_null(t);
    assert_int_equal(t->type, 2);
    assert_int_equal(t->ne[0], 32);
    assert_int_equal(t->ne[1], 2);
    assert_int_equal(t->n_bytes, 36);
    const struct gguf_tensor *first = gguf_tensor_at(f, 0);
    assert_int_equal((const char *)t->data - (const char *)first->data, 32);
    assert_null(gguf_find_tensor(f, "missing.weight"));
    gguf_close(f);
}

static void test_v2_and_alignment(void **state) {
    (void)state;
    struct gguf_file *f = open_ok("gguf/valid_v2.gguf");
    assert_int_equal(gguf_version(f), 2);
    gguf_close(f);
    f = open_ok("gguf/valid_align64.gguf");
    assert_int_equal(gguf_alignment(f), 64);
    const struct gguf_tensor *a = gguf_find_tensor(f, "a.weight"), *b = gguf_find_tensor(f, "b.weight");
    assert_int_equal((const char *)b->data - (const char *)a->data, 64);
    assert_int_equal(((uintptr_t)a->data) % 64, 0); /* mmap is page-aligned, data offset is aligned */
    gguf_close(f);
    f = open_ok("gguf/valid_no_tensors.gguf");
    assert_int_equal(gguf_tensor_count(f), 0);
    assert_null(gguf_find_tensor(f, "a.weight"));
    gguf_close(f);
}

static void test_split_model(void **state) {
    (void)state;
    struct gguf_file *f = open_ok("gguf/valid_split-00001-of-00003.gguf");
    assert_int_equal(gguf_part_count(f), 3);
    assert_int_equal(gguf_tensor_count(f), 3);
    for (int p = 0; p < 3; p++) {
        char name[32];
        snprintf(name, sizeof name, "p%d.weight", p);
        const struct gguf_tensor *t = gguf_find_tensor(f, name);
        assert_non_null(t);
        assert_int_equal(t->part, p);
    }
    struct gguf_str arch;
    assert_int_equal(gguf_get_str(f, "general.architecture", &arch), PSHARD_OK);
    gguf_close(f);
    struct gguf_file *g = NULL;
    assert_int_equal(gguf_open(test_data_path("gguf/valid_split-00002-of-00003.gguf"), &g), PSHARD_ERR_INVALID_ARG);
    assert_null(g);
    assert_non_null(strstr(pshard_last_error(), "part 2"));
}

static void test_malformed_corpus(void **state) {
    (void)state;
    FILE *list = fopen(test_data_path("gguf/malformed.tsv"), "r");
    assert_non_null(list);
    char line[512];
    int checked = 0;
    while (fgets(line, sizeof line, list)) {
        if (line[0] == '#') continue;
        line[strcspn(line, "\n")] = '\0';
        char *tab = strchr(line, '\t');
        assert_non_null(tab);
        *tab = '\0';
        const char *name = line, *expect = tab + 1;
        char rel[600];
        snprintf(rel, sizeof rel, "gguf/%s", name);
        struct gguf_file *f = NULL;
        pshard_status st = gguf_open(test_data_path(rel), &f);
        if (st == PSHARD_OK) fail_msg("%s opened but must fail with '%s'", name, expect);
        assert_null(f);
        const char *msg = pshard_last_error();
        if (!strstr(msg, expect)) fail_msg("%s: message '%s' lacks '%s'", name, msg, expect);
        if (!strstr(msg, name) && !strstr(expect, ".gguf")) fail_msg("%s: message '%s' does not name the file", name, msg);
        /* The same bytes from memory, in a buffer of exactly their size. */
        size_t size = 0;
        unsigned char *bytes = test_read_file(test_data_path(rel), &size);
        assert_non_null(bytes);
        if (!strstr(name, "-of-")) {
            assert_int_not_equal(gguf_open_memory(bytes, size, name, &f), PSHARD_OK);
            assert_null(f);
        }
        free(bytes);
        checked++;
    }
    fclose(list);
    assert_true(checked >= 30);
}

/* Every proper prefix of a valid file must be refused cleanly (sanitizers watch the reads). */
static void test_every_truncation(void **state) {
    (void)state;
    size_t size = 0;
    unsigned char *whole = test_read_file(test_data_path("gguf/valid_v3_all_types.gguf"), &size);
    assert_non_null(whole);
    for (size_t n = 0; n < size; n++) {
        unsigned char *prefix = malloc(n ? n : 1);
        memcpy(prefix, whole, n);
        struct gguf_file *f = NULL;
        pshard_status st = gguf_open_memory(prefix, n, "prefix", &f);
        if (st == PSHARD_OK) fail_msg("a %zu-byte prefix of a %zu-byte file opened", n, size);
        free(prefix);
    }
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open_memory(whole, size, "whole", &f), PSHARD_OK);
    gguf_close(f);
    free(whole);
}

static void test_missing_file(void **state) {
    (void)state;
    struct gguf_file *f = NULL;
    assert_int_equal(gguf_open("/nonexistent/model.gguf", &f), PSHARD_ERR_IO);
    assert_non_null(strstr(pshard_last_error(), "/nonexistent/model.gguf"));
    assert_int_equal(gguf_open(test_data_path("gguf"), &f), PSHARD_ERR_IO); /* a directory */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_metadata_types), cmocka_unit_test(test_v2_and_alignment),
        cmocka_unit_test(test_split_model),        cmocka_unit_test(test_malformed_corpus),
        cmocka_unit_test(test_every_truncation),   cmocka_unit_test(test_missing_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
