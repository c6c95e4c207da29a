/* M-RoPE positions of image tokens and the axis each rotated pair follows (see mrope.h). */
#include "vision/mrope.h"

uint32_t vision_mrope_image_positions(uint32_t tokens_h, uint32_t tokens_w, uint32_t start, uint32_t *pos_time,
                                      uint32_t *pos_row, uint32_t *pos_col) {
    for (uint32_t r = 0; r < tokens_h; r++)
        for (uint32_t c = 0; c < tokens_w; c++) {
            const uint32_t i = r * tokens_w + c;
            pos_time[i] = start; /* a still image is one moment */
            pos_row[i] = start + r;
            pos_col[i] = start + c;
        }
    return start + (tokens_h > tokens_w ? tokens_h : tokens_w);
}

enum mrope_axis vision_mrope_axis(const uint32_t sections[4], uint32_t pair) {
    const uint32_t total = sections[0] + sections[1] + sections[2] + sections[3];
    if (total == 0) return MROPE_TIME;
    const uint32_t k = pair % total;
    if (k < sections[0]) return MROPE_TIME;
    if (k < sections[0] + sections[1]) return MROPE_ROW;
    if (k < sections[0] + sections[1] + sections[2]) return MROPE_COLUMN;
    return MROPE_EXTRA;
}
