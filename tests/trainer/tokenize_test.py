"""tools/tokenize_jsonl.py and primecfg-train's pre-tokenized JSONL, end to end.

A small word-level tokenizer with a chat template is saved beside a small
transformers model; the tool turns chat and prompt/completion records into
input_ids + loss_mask (loss on the assistant turns only, checked token by
token), primecfg-train trains on them, and the data errors name file and line:
a record whose loss tokens all lie past seq_len is refused, a truncated one is
reported.

usage: tokenize_test.py PRIMECFG_TRAIN SOURCE_ROOT
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

TRAIN, ROOT = sys.argv[1], sys.argv[2]
TOOL = os.path.join(ROOT, "tools", "tokenize_jsonl.py")
SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
WORDS = "user assistant system hello world good day how are you fine thanks a b c d e f g".split()
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def make_model_dir(d):
    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>", additional_special_tokens=SPECIAL[3:]
    )
    tok.chat_template = TEMPLATE
    tok.save_pretrained(d)
    cfg = transformers.LlamaConfig(
        vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128,
    )
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    return vocab


def run(cmd, ok=True):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if ok and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    return p


def train(work, model_dir, jsonl, seq_len, steps=2, ok=True):
    toml = os.path.join(work, "run.toml")
    with open(toml, "w") as f:
        f.write(
            f"""max_steps = {steps}
output_dir = {json.dumps(os.path.join(work, "out"))}
clean = true
[model]
name = {json.dumps(model_dir)}
attn = "sdpa"
compile = "None"
[data]
path = {json.dumps(jsonl)}
seq_len = {seq_len}
batch_size = 2
micro_batch_size = 1
shuffle = false
"""
        )
    return run([TRAIN, "@", toml, "--device=cpu"], ok=ok)


def write_jsonl(path, recs):
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


def main():
    work = tempfile.mkdtemp(prefix="tokenize-")
    model_dir = os.path.join(work, "model")
    vocab = make_model_dir(model_dir)
    inv = {i: w for w, i in vocab.items()}
    src = os.path.join(work, "chat.jsonl")
    write_jsonl(
        src,
        [
            {"messages": [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "good day"}]},
            {
                "prompt": [{"role": "system", "content": "a b"}, {"role": "user", "content": "how are you"}],
                "completion": [{"role": "assistant", "content": "fine thanks"}],
            },
            {"prompt": "hello", "completion": "world"},
        ],
    )
    out = os.path.join(work, "tokens.jsonl")
    run([sys.executable, TOOL, model_dir, src, out])
    recs = [json.loads(line) for line in open(out)]
    trained = [" ".join(inv[t] for t, m in zip(r["input_ids"], r["loss_mask"]) if m) for r in recs]
    want = ["good day <|im_end|>", "fine thanks <|im_end|>", "world </s>"]
    assert trained == want, f"loss tokens {trained}, want {want}"
    text0 = " ".join(inv[t] for t in recs[0]["input_ids"])
    assert text0 == "<|im_start|> user hello world <|im_end|> <|im_start|> assistant good day <|im_end|>", text0
    print("ok tokenize: loss on the assistant turns and the completion only")

    # The tool's errors name file and line.
    bad = os.path.join(work, "bad.jsonl")
    write_jsonl(bad, [{"prompt": "a", "completion": "b"}, {"messages": [{"role": "user", "content": "a"}]}])
    p = run([sys.executable, TOOL, model_dir, bad, os.path.join(work, "bad-out.jsonl")], ok=False)
    assert p.returncode == 1 and "bad.jsonl:2" in p.stderr and not os.path.exists(os.path.join(work, "bad-out.jsonl")), p.stderr
    print("ok tokenize: a record without a loss token is an error naming its line, no output left")

    # primecfg-train trains on the tool's output.
    p = train(work, model_dir, out, seq_len=32)
    assert "done: steps 0..2" in p.stderr, p.stderr
    print("ok train on pre-tokenized records")

    # Truncation: reported when the loss survives it, an error when it does not.
    long_ok = {"input_ids": [1] + [5] * 40, "loss_mask": [0] + [1] * 40}
    long_bad = {"input_ids": [1] * 30 + [6, 7], "loss_mask": [0] * 30 + [1, 1]}
    j = os.path.join(work, "long.jsonl")
    write_jsonl(j, [long_ok, {"input_ids": [1, 2, 3]}])
    p = train(work, model_dir, j, seq_len=16)
    assert "1 of 2 records have more than seq_len + 1 = 17 tokens" in p.stderr and "long.jsonl:1" in p.stderr, p.stderr
    write_jsonl(j, [{"input_ids": [1, 2, 3]}, long_bad])
    p = train(work, model_dir, j, seq_len=16, ok=False)
    assert p.returncode == 1 and "long.jsonl:2" in p.stderr and "past seq_len + 1" in p.stderr, p.stderr
    write_jsonl(j, [{"input_ids": [1, 2, 3], "loss_mask": [1, 0, 0]}])
    p = train(work, model_dir, j, seq_len=16, ok=False)
    assert p.returncode == 1 and "long.jsonl:1" in p.stderr and "no token to train on" in p.stderr, p.stderr
    write_jsonl(j, [{"messages": []}])
    p = train(work, model_dir, j, seq_len=16, ok=False)
    assert p.returncode == 1 and "tokenize_jsonl.py" in p.stderr, p.stderr
    print("ok data errors: truncation reported, loss cut to nothing refused, untokenized chat refused")
    print("4 passed, 0 failed")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
