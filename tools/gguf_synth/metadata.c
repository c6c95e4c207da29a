/* The metadata keys llama.cpp reads for the llama, qwen3moe and qwen2vl architectures, the
 * tokenizer keys of a byte-level BPE ("gpt2") vocabulary, and an mmproj file's clip.* keys. */
#include <stdio.h>

#include "synth.h"

/* ChatML, as Qwen's instruct models ship it (without tools). */
static const char chatml_template[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/* An mmproj file's keys, as llama.cpp's converter writes Qwen2.5-VL's vision tower: the shared
 * clip.vision.* hyper-parameters, OpenAI CLIP's normalization (Qwen's preprocessor config), and
 * the window attention pattern (every n-th layer attends over the whole image). It writes no
 * window size (Qwen's 112 pixels is assumed) and no pixel limits. */
static void clip_metadata(struct synth_kv *kv, const struct synth_shape *s) {
    static const float mean[3] = {0.48145466f, 0.4578275f, 0.40821073f};
    static const float std[3] = {0.26862954f, 0.26130258f, 0.27577711f};
    synth_kv_bool(kv, "clip.has_vision_encoder", true);
    synth_kv_u32(kv, "clip.vision.projection_dim", s->projection_dim);
    synth_kv_u32(kv, "clip.vision.image_size", s->image_size);
    synth_kv_u32(kv, "clip.vision.patch_size", s->patch_size);
    synth_kv_u32(kv, "clip.vision.embedding_length", s->n_embd);
    synth_kv_u32(kv, "clip.vision.feed_forward_length", s->n_ff);
    synth_kv_u32(kv, "clip.vision.block_count", s->n_layer);
    synth_kv_u32(kv, "clip.vision.attention.head_count", s->n_head);
    synth_kv_f32_array(kv, "clip.vision.image_mean", mean, 3);
    synth_kv_f32_array(kv, "clip.vision.image_std", std, 3);
    synth_kv_str(kv, "clip.projector_type", "qwen2.5vl_merger");
    synth_kv_bool(kv, "clip.use_silu", true);
    synth_kv_u32(kv, "clip.vision.n_wa_pattern", s->n_wa_pattern);
    synth_kv_f32(kv, "clip.vision.attention.layer_norm_epsilon", s->rms_eps);
}

void synth_metadata(struct synth_kv *kv, const struct synth_model *model,
                    const struct synth_vocab *vocab, uint64_t seed) {
    const struct synth_shape *s = &model->shape;
    const char *arch = synth_arch_name(s->arch);
    char key[128], name[128];
#define ARCH_KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)

    synth_kv_str(kv, "general.architecture", arch);
    synth_kv_str(kv, "general.type", s->arch == SYNTH_ARCH_CLIP ? "mmproj" : "model");
    snprintf(name, sizeof name, "pshard synthetic %s", s->name);
    synth_kv_str(kv, "general.name", name);
    synth_kv_u32(kv, "general.alignment", SYNTH_ALIGNMENT);
    synth_kv_u32(kv, "general.file_type", synth_model_file_type(model));
    synth_kv_u32(kv, "general.quantization_version", 2);
    synth_kv_str(kv, "pshard.synth.shape", s->name);
    synth_kv_u64(kv, "pshard.synth.seed", seed);
    if (s->arch == SYNTH_ARCH_CLIP) {
        clip_metadata(kv, s);
        return;
    }

    synth_kv_u32(kv, ARCH_KEY("vocab_size"), s->n_vocab);
    synth_kv_u32(kv, ARCH_KEY("context_length"), s->n_ctx);
    synth_kv_u32(kv, ARCH_KEY("embedding_length"), s->n_embd);
    synth_kv_u32(kv, ARCH_KEY("block_count"), s->n_layer);
    synth_kv_u32(kv, ARCH_KEY("feed_forward_length"), s->n_ff);
    synth_kv_u32(kv, ARCH_KEY("attention.head_count"), s->n_head);
    synth_kv_u32(kv, ARCH_KEY("attention.head_count_kv"), s->n_head_kv);
    /* llama.cpp defaults the head size to embedding_length / head_count; say it always, since
     * qwen3moe (and Minitron-4B) have head_count * head size != embedding_length. */
    synth_kv_u32(kv, ARCH_KEY("attention.key_length"), s->head_dim);
    synth_kv_u32(kv, ARCH_KEY("attention.value_length"), s->head_dim);
    synth_kv_f32(kv, ARCH_KEY("rope.freq_base"), s->rope_freq_base);
    synth_kv_f32(kv, ARCH_KEY("attention.layer_norm_rms_epsilon"), s->rms_eps);
    if (s->arch == SYNTH_ARCH_LLAMA) synth_kv_u32(kv, ARCH_KEY("rope.dimension_count"), s->head_dim);
    if (s->arch == SYNTH_ARCH_QWEN2VL) { /* llama.cpp reads 4 sections; its converter pads with 0 */
        const int32_t sections[4] = {(int32_t)s->rope_sections[0], (int32_t)s->rope_sections[1],
                                     (int32_t)s->rope_sections[2], (int32_t)s->rope_sections[3]};
        synth_kv_i32_array(kv, ARCH_KEY("rope.dimension_sections"), sections, 4);
    }
    if (s->n_expert > 0) {
        synth_kv_u32(kv, ARCH_KEY("expert_count"), s->n_expert);
        synth_kv_u32(kv, ARCH_KEY("expert_used_count"), s->n_expert_used);
        synth_kv_u32(kv, ARCH_KEY("expert_feed_forward_length"), s->n_ff_exp);
        /* Qwen3 MoE renormalizes the chosen experts' softmax weights (norm_topk_prob). */
        synth_kv_bool(kv, ARCH_KEY("expert_weights_norm"), true);
    }
#undef ARCH_KEY

    synth_kv_str(kv, "tokenizer.ggml.model", "gpt2");
    synth_kv_str(kv, "tokenizer.ggml.pre", s->pre);
    synth_kv_str_array(kv, "tokenizer.ggml.tokens", vocab->tokens, vocab->n_tokens);
    synth_kv_i32_array(kv, "tokenizer.ggml.token_type", vocab->types, vocab->n_tokens);
    synth_kv_str_array(kv, "tokenizer.ggml.merges", vocab->merges, vocab->n_merges);
    synth_kv_u32(kv, "tokenizer.ggml.bos_token_id", vocab->id_endoftext);
    synth_kv_u32(kv, "tokenizer.ggml.eos_token_id", vocab->id_im_end);
    synth_kv_u32(kv, "tokenizer.ggml.padding_token_id", vocab->id_endoftext);
    /* Llama-family models start with BOS; Qwen's do not. */
    synth_kv_bool(kv, "tokenizer.ggml.add_bos_token", s->arch == SYNTH_ARCH_LLAMA);
    synth_kv_bool(kv, "tokenizer.ggml.add_eos_token", false);
    synth_kv_str(kv, "tokenizer.chat_template", chatml_template);
}
