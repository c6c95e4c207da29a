/* M-RoPE positions of an image's tokens (see mrope.h). */
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
