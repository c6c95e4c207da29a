/* Opening GGUF files: mapping, split models (NAME-00001-of-0000N.gguf), the joined tensor
 * table with a name index, and the file handle's accessors. */
#include "gguf/gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

enum { GGUF_MAX_PARTS = 9999 };

struct gguf_part {
    char *path;
    struct gguf_image image;
    bool mapped; /* base came from mmap (else the caller's memory) */
};

struct gguf_file {
    char *path;
    uint32_t n_parts;
    struct gguf_part *parts;
    uint64_t n_tensors;
    struct gguf_tensor *tensors; /* all parts' tensors, in file order */
    uint64_t *name_index;        /* open addressing: tensor index + 1, 0 = empty */
    uint64_t index_slots;        /* a power of two */
};

bool gguf_str_eq(struct gguf_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && memcmp(s.data, cstr, n) == 0;
}

static uint64_t hash_bytes(const char *data, uint64_t len) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (uint64_t i = 0; i < len; i++) h = (h ^ (uint8_t)data[i]) * 1099511628211ull;
    return h;
}

static pshard_status map_file(const char *path, struct gguf_part *part) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return core_fail(PSHARD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return core_fail(PSHARD_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return core_fail(PSHARD_ERR_FORMAT, "%s: file is empty", path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return core_fail(PSHARD_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    part->image.base = map;
    part->image.size = (uint64_t)st.st_size;
    part->mapped = true;
    return PSHARD_OK;
}

static void free_part(struct gguf_part *part) {
    if (part->mapped) munmap((void *)part->image.base, part->image.size);
    gguf_image_free(&part->image);
    free(part->path);
}

void gguf_close(struct gguf_file *file) {
    if (!file) return;
    for (uint32_t i = 0; i < file->n_parts; i++) free_part(&file->parts[i]);
    free(file->parts);
    free(file->tensors);
    free(file->name_index);
    free(file->path);
    free(file);
}

/* Recognize NAME-00001-of-0000N.gguf: return N and the prefix length, or 0 if not split. */
static uint32_t split_count(const char *path, size_t *prefix_len, uint32_t *part_no) {
    size_t n = strlen(path);
    const char *tail = "-00000-of-00000.gguf";
    size_t tail_len = strlen(tail);
    if (n < tail_len) return 0;
    const char *s = path + n - tail_len;
    unsigned no, count;
    char end[8];
    if (s[0] != '-' || sscanf(s, "-%5u-of-%5u%7s", &no, &count, end) != 3 || strcmp(end, ".gguf") != 0) return 0;
    if (count == 0 || count > GGUF_MAX_PARTS) return 0;
    *prefix_len = (size_t)(s - path);
    *part_no = no;
    return count;
}

static pshard_status build_name_index(struct gguf_file *file) {
    uint64_t slots = 16;
    while (slots < file->n_tensors * 2) slots *= 2;
    file->name_index = calloc(slots, sizeof *file->name_index);
    if (!file->name_index) return core_fail(PSHARD_ERR_NOMEM, "%s: out of memory indexing tensors", file->path);
    file->index_slots = slots;
    for (uint64_t i = 0; i < file->n_tensors; i++) {
        const struct gguf_tensor *t = &file->tensors[i];
        uint64_t slot = hash_bytes(t->name.data, t->name.len) & (slots - 1);
        while (file->name_index[slot]) {
            const struct gguf_tensor *other = &file->tensors[file->name_index[slot] - 1];
            if (other->name.len == t->name.len && memcmp(other->name.data, t->name.data, t->name.len) == 0)
                return core_fail(PSHARD_ERR_FORMAT, "%s: tensor name '%.*s' appears more than once",
                                 file->parts[t->part].path, (int)t->name.len, t->name.data);
            slot = (slot + 1) & (slots - 1);
        }
        file->name_index[slot] = i + 1;
    }
    return PSHARD_OK;
}

/* Every part must agree on the split count it declares and on its own number. */
static pshard_status check_split_keys(const struct gguf_file *file) {
    for (uint32_t p = 0; p < file->n_parts; p++) {
        const struct gguf_image *img = &file->parts[p].image;
        for (uint64_t i = 0; i < img->n_kv; i++) {
            const struct gguf_kv *kv = &img->kv[i];
            int64_t value;
            bool is_count = gguf_str_eq(kv->key, "split.count"), is_no = gguf_str_eq(kv->key, "split.no");
            if (!is_count && !is_no) continue;
            if (gguf_kv_i64(kv, &value) != PSHARD_OK || value != (is_count ? (int64_t)file->n_parts : (int64_t)p))
                return core_fail(PSHARD_ERR_FORMAT, "%s: %s does not match the file name (part %u of %u)",
                                 file->parts[p].path, is_count ? "split.count" : "split.no", p + 1, file->n_parts);
        }
    }
    return PSHARD_OK;
}

static pshard_status join_parts(struct gguf_file *file) {
    uint64_t total = 0;
    for (uint32_t p = 0; p < file->n_parts; p++) total += file->parts[p].image.n_tensors;
    file->tensors = calloc(total ? total : 1, sizeof *file->tensors);
    if (!file->tensors) return core_fail(PSHARD_ERR_NOMEM, "%s: out of memory", file->path);
    for (uint32_t p = 0; p < file->n_parts; p++) {
        const struct gguf_image *img = &file->parts[p].image;
        for (uint64_t i = 0; i < img->n_tensors; i++) {
            file->tensors[file->n_tensors] = img->tensors[i];
            file->tensors[file->n_tensors].part = p;
            file->n_tensors++;
        }
    }
    CORE_TRY(check_split_keys(file));
    return build_name_index(file);
}

static pshard_status new_file(const char *path, uint32_t n_parts, struct gguf_file **out) {
    struct gguf_file *file = calloc(1, sizeof *file);
    if (file) file->path = strdup(path);
    if (file) file->parts = calloc(n_parts, sizeof *file->parts);
    if (!file || !file->path || !file->parts) {
        gguf_close(file);
        return core_fail(PSHARD_ERR_NOMEM, "%s: out of memory", path);
    }
    *out = file;
    return PSHARD_OK;
}

static pshard_status open_parts(struct gguf_file *file, const char *path) {
    size_t prefix_len = 0;
    uint32_t part_no = 0;
    uint32_t count = split_count(path, &prefix_len, &part_no);
    if (count > 1 && part_no != 1)
        return core_fail(PSHARD_ERR_INVALID_ARG, "%s: this is part %u of a split model; open part 1 (-00001-of-%05u.gguf)",
                         path, part_no, count);
    file->n_parts = 0;
    for (uint32_t p = 0; p < (count > 1 ? count : 1); p++) {
        struct gguf_part *part = &file->parts[p];
        if (p == 0) {
            part->path = strdup(path);
        } else {
            size_t len = prefix_len + 32;
            part->path = malloc(len);
            if (part->path) snprintf(part->path, len, "%.*s-%05u-of-%05u.gguf", (int)prefix_len, path, p + 1, count);
        }
        if (!part->path) return core_fail(PSHARD_ERR_NOMEM, "%s: out of memory", path);
        file->n_parts = p + 1;
        CORE_TRY(map_file(part->path, part));
        CORE_TRY(gguf_parse_image(&part->image, part->path));
    }
    return PSHARD_OK;
}

pshard_status gguf_open(const char *path, struct gguf_file **out) {
    *out = NULL;
    if (!path) return core_fail(PSHARD_ERR_INVALID_ARG, "no model path given");
    size_t prefix_len;
    uint32_t part_no, count = split_count(path, &prefix_len, &part_no);
    struct gguf_file *file;
    CORE_TRY(new_file(path, count > 1 ? count : 1, &file));
    pshard_status st = open_parts(file, path);
    if (st == PSHARD_OK) st = join_parts(file);
    if (st != PSHARD_OK) {
        gguf_close(file);
        return st;
    }
    *out = file;
    return PSHARD_OK;
}

pshard_status gguf_open_memory(const void *data, size_t size, const char *label, struct gguf_file **out) {
    *out = NULL;
    struct gguf_file *file;
    CORE_TRY(new_file(label, 1, &file));
    file->n_parts = 1;
    file->parts[0].path = strdup(label);
    file->parts[0].image.base = data;
    file->parts[0].image.size = size;
    pshard_status st = file->parts[0].path ? PSHARD_OK : core_fail(PSHARD_ERR_NOMEM, "out of memory");
    if (st == PSHARD_OK && size == 0) st = core_fail(PSHARD_ERR_FORMAT, "%s: file is empty", label);
    if (st == PSHARD_OK) st = gguf_parse_image(&file->parts[0].image, label);
    if (st == PSHARD_OK) st = join_parts(file);
    if (st != PSHARD_OK) {
        gguf_close(file);
        return st;
    }
    *out = file;
    return PSHARD_OK;
}

/* ---- accessors */

static const struct gguf_image *first(const struct gguf_file *file) { return &file->parts[0].image; }

uint32_t gguf_version(const struct gguf_file *file) { return first(file)->version; }
uint32_t gguf_alignment(const struct gguf_file *file) { return first(file)->alignment; }
uint32_t gguf_part_count(const struct gguf_file *file) { return file->n_parts; }

const void *gguf_part_image(const struct gguf_file *file, uint32_t index, size_t *size) {
    *size = 0;
    if (index >= file->n_parts) return NULL;
    *size = file->parts[index].image.size;
    return file->parts[index].image.base;
}
const char *gguf_path(const struct gguf_file *file) { return file->path; }

uint64_t gguf_file_bytes(const struct gguf_file *file) {
    uint64_t total = 0;
    for (uint32_t p = 0; p < file->n_parts; p++) total += file->parts[p].image.size;
    return total;
}

uint64_t gguf_kv_count(const struct gguf_file *file) { return first(file)->n_kv; }

const struct gguf_kv *gguf_kv_at(const struct gguf_file *file, uint64_t index) {
    return index < first(file)->n_kv ? &first(file)->kv[index] : NULL;
}

const struct gguf_kv *gguf_find(const struct gguf_file *file, const char *key) {
    const struct gguf_image *img = first(file);
    for (uint64_t i = 0; i < img->n_kv; i++)
        if (gguf_str_eq(img->kv[i].key, key)) return &img->kv[i];
    return NULL;
}

uint64_t gguf_tensor_count(const struct gguf_file *file) { return file->n_tensors; }

const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *file, uint64_t index) {
    return index < file->n_tensors ? &file->tensors[index] : NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *file, const char *name) {
    size_t len = strlen(name);
    uint64_t slot = hash_bytes(name, len) & (file->index_slots - 1);
    while (file->name_index[slot]) {
        const struct gguf_tensor *t = &file->tensors[file->name_index[slot] - 1];
        if (t->name.len == len && memcmp(t->name.data, name, len) == 0) return t;
        slot = (slot + 1) & (file->index_slots - 1);
    }
    return NULL;
}
