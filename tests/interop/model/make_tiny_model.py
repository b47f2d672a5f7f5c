#!/usr/bin/env python3
"""Make the tiny model the interop suites serve with a real vLLM.

    python make_tiny_model.py OUT_DIR      write the model into OUT_DIR (made anew)
    python make_tiny_model.py --digest D   print the digest of a model directory D

There is no model hub here, so the model is made, not downloaded: a Llama with
random weights from a fixed seed and a byte-level BPE tokenizer trained on the
fixed text below. Every run writes the same bytes (the digest printed at the
end is over every file), so a cached copy is reused only while it matches.

What vLLM needs from it, and why each choice:
- head size 64: one of the head sizes vLLM's CPU attention takes;
- float32 weights: the suites run vLLM with --dtype float32;
- <tool_call> and </tool_call> as added tokens: vLLM's hermes tool parser
  refuses a tokenizer without them (forced tool calls do not use the parser:
  structured outputs make them schema-valid whatever the weights);
- a chat template that renders tools, tool calls and tool results, and reads
  the chat_template_kwargs key enable_thinking, so the kwargs are observable
  in the prompt's token ids.

Needs numpy, tokenizers and safetensors (all in the vllm environment).
"""

import hashlib
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SEED = 45
VOCAB_SIZE = 1024
HIDDEN = 128
HEADS = 2  # head size HIDDEN / HEADS = 64
KV_HEADS = 1
LAYERS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 4096

SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
           "<|start_header_id|>", "<|end_header_id|>"]
ADDED = ["<tool_call>", "</tool_call>", "<think>", "</think>"]

# The chat template: Llama-3-like headers, tools listed in a system turn, tool
# calls rendered in hermes style, enable_thinking observable.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\n"
    "You may call these tools:\n"
    "{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}<|eot_id|>{%- endif %}"
    "{%- for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{%- if m['content'] is string %}{{ m['content'] }}"
    "{%- elif m['content'] %}{%- for p in m['content'] %}"
    "{%- if p['type'] == 'text' %}{{ p['text'] }}{%- endif %}{%- endfor %}{%- endif %}"
    "{%- if m['tool_calls'] is defined and m['tool_calls'] %}"
    "{%- for tc in m['tool_calls'] %}<tool_call>"
    "{\"name\": {{ tc['function']['name'] | tojson }}, \"arguments\": "
    "{%- if tc['function']['arguments'] is string %} {{ tc['function']['arguments'] }}"
    "{%- else %} {{ tc['function']['arguments'] | tojson }}{%- endif %}}"
    "</tool_call>{%- endfor %}{%- endif %}"
    "<|eot_id|>"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{%- if enable_thinking is defined and enable_thinking %}<think>{%- endif %}"
    "{%- endif %}"
)


def corpus():
    """The fixed text the tokenizer learns from: the words the suites send."""
    words = ("what is the weather in paris london tokyo berlin rome madrid oslo lima cairo "
             "sunny cloudy rain snow wind cold warm hot degrees celsius today tomorrow "
             "please call the tool get_weather city answer briefly thanks hello world "
             "count increment target reached done say something about numbers and letters")
    lines = []
    parts = words.split()
    for i in range(400):
        a, b, c = parts[i % len(parts)], parts[(i * 7) % len(parts)], parts[(i * 13) % len(parts)]
        lines.append(f"{a} {b} {c}, {i} {{\"city\": \"{b}\"}} ({c}) {a.upper()}!?")
    lines.append("".join(chr(c) for c in range(32, 127)))
    return lines


def make_tokenizer():
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(ADDED),
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.add_tokens(ADDED)
    return tok


def make_weights(vocab):
    rng = np.random.default_rng(SEED)

    def w(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    head = HIDDEN // HEADS
    t = {"model.embed_tokens.weight": w(vocab, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "self_attn.q_proj.weight"] = w(HEADS * head, HIDDEN)
        t[p + "self_attn.k_proj.weight"] = w(KV_HEADS * head, HIDDEN)
        t[p + "self_attn.v_proj.weight"] = w(KV_HEADS * head, HIDDEN)
        t[p + "self_attn.o_proj.weight"] = w(HIDDEN, HEADS * head)
        t[p + "mlp.gate_proj.weight"] = w(INTERMEDIATE, HIDDEN)
        t[p + "mlp.up_proj.weight"] = w(INTERMEDIATE, HIDDEN)
        t[p + "mlp.down_proj.weight"] = w(HIDDEN, INTERMEDIATE)
        t[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    t["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    t["lm_head.weight"] = w(vocab, HIDDEN)
    return t


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def digest(directory):
    h = hashlib.sha256()
    for name in sorted(os.listdir(directory)):
        if name.startswith("."):
            continue
        h.update(name.encode() + b"\0")
        with open(os.path.join(directory, name), "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def main(argv):
    if len(argv) == 3 and argv[1] == "--digest":
        print(digest(argv[2]))
        return 0
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = argv[1]
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):
        os.remove(os.path.join(out, name))

    tok = make_tokenizer()
    # The fixed text yields fewer merges than VOCAB_SIZE allows; the model's
    # vocabulary is exactly the tokenizer's, so every sampled id decodes.
    vocab = tok.get_vocab_size()
    tok.save(os.path.join(out, "tokenizer.json"), pretty=False)
    ids = {t: tok.token_to_id(t) for t in SPECIAL + ADDED}

    write_json(os.path.join(out, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "pad_token": "<|end_of_text|>",
        "model_max_length": MAX_POSITIONS,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(ids[t]): {"content": t, "special": t in SPECIAL, "lstrip": False, "rstrip": False,
                          "normalized": False, "single_word": False}
            for t in SPECIAL + ADDED
        },
    })
    write_json(os.path.join(out, "config.json"), {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": ids["<|begin_of_text|>"],
        "eos_token_id": ids["<|eot_id|>"],
        "pad_token_id": ids["<|end_of_text|>"],
    })
    write_json(os.path.join(out, "generation_config.json"), {
        "bos_token_id": ids["<|begin_of_text|>"],
        "eos_token_id": ids["<|eot_id|>"],
        "pad_token_id": ids["<|end_of_text|>"],
    })
    save_file(make_weights(vocab), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    print(digest(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
