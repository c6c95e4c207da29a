/* Multimodal rotary positions (M-RoPE) of a Qwen2-VL / Qwen2.5-VL language model, the part a
 * prompt with an image needs: every token has three positions (time, row, column). Text tokens
 * have all three equal to their index; an image's tokens, starting at position `start`, have
 * time = start and row/column = start + their place in the image's grid of merged tokens;
 * the text after the image goes on from start + max(rows, columns), as the model's processor
 * (get_rope_index) and llama.cpp count. Which of the three turns each rotated pair of a head is
 * the rope's business (cpu_rope_axis). */
#ifndef VISION_MROPE_H
#define VISION_MROPE_H

#include <stdint.h>

/* Positions of an image of tokens_h x tokens_w merged tokens (raster order) starting at
 * `start`; writes tokens_h * tokens_w entries to each array and returns the position the next
 * text token gets. */
uint32_t vision_mrope_image_positions(uint32_t tokens_h, uint32_t tokens_w, uint32_t start, uint32_t *pos_time,
                                      uint32_t *pos_row, uint32_t *pos_col);

#endif
