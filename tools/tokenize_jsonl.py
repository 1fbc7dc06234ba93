#!/usr/bin/env python3
"""Pre-tokenizes SFT data for primecfg-train with the model's own tokenizer.

    python3 tools/tokenize_jsonl.py MODEL_DIR IN.jsonl OUT.jsonl [--loss-roles assistant]

MODEL_DIR is a local HF model directory (its tokenizer files and chat template;
nothing is downloaded). Each input line is one of
  {"prompt": str, "completion": str}          plain text: BOS (if the tokenizer adds one) +
                                              prompt + completion + EOS, loss on completion + EOS
  {"messages": [{"role", "content"}, ...]}    a chat, rendered by the chat template
  {"prompt": [msgs], "completion": [msgs]}    prime-rl's SFT form of a chat
and becomes {"input_ids": [...], "loss_mask": [...]}, the pre-tokenized records
that data.path reads. In a chat, the tokens of each message whose role is in
--loss-roles count in the loss (the template's header before an assistant turn,
its generation prompt, does not). Errors name the file and line and exit 1.
"""

import argparse
import json
import os
import sys


def fail(msg):
    print(f"tokenize_jsonl: error: {msg}", file=sys.stderr)
    sys.exit(1)


def is_prefix(a, b):
    return len(a) <= len(b) and b[: len(a)] == a


class Tokenize:
    def __init__(self, tok, loss_roles):
        self.tok = tok
        self.loss_roles = set(loss_roles)

    def ids(self, text):
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def render(self, messages, generation_prompt=False):
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def text(self, prompt, completion):
        tok = self.tok
        prompt_ids = tok(prompt, add_special_tokens=True)["input_ids"]
        completion_ids = self.ids(completion)
        if tok.eos_token_id is None:
            raise ValueError("the tokenizer has no eos_token; a completion needs an end")
        ids = prompt_ids + completion_ids + [tok.eos_token_id]
        mask = [0] * len(prompt_ids) + [1] * (len(completion_ids) + 1)
        return ids, mask

    def chat(self, messages):
        if not self.tok.chat_template:
            raise ValueError("the tokenizer has no chat template (tokenizer_config.json / chat_template.jinja)")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError(f"messages[{i}] needs string 'role' and 'content'")
        full = self.ids(self.render(messages))
        mask = [0] * len(full)
        for i, m in enumerate(messages):
            if m["role"] not in self.loss_roles:
                continue
            # The message's tokens: from the end of everything before it (with the
            # generation prompt, when it is the model's turn) to the end of it.
            before = self.ids(self.render(messages[:i], generation_prompt=m["role"] == "assistant")) if i else []
            through = self.ids(self.render(messages[: i + 1]))
            if not (is_prefix(before, through) and is_prefix(through, full)):
                raise ValueError(
                    f"the chat template does not render messages[{i}] as an extension of the messages before it "
                    "(e.g. it rewrites earlier turns), so its tokens cannot be told apart"
                )
            for k in range(len(before), len(through)):
                mask[k] = 1
        return full, mask


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--loss-roles", nargs="+", default=["assistant"], help="chat roles whose tokens count (assistant)")
    args = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if not os.path.isdir(args.model_dir):
        fail(f"{args.model_dir}: not a directory (a local HF model directory with tokenizer files)")
    if not os.path.isfile(args.input):
        fail(f"{args.input}: not a regular file")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(args.model_dir, local_files_only=True)
    except Exception as e:  # transformers raises many kinds
        fail(f"{args.model_dir}: cannot load its tokenizer: {e}")
    t = Tokenize(tok, args.loss_roles)

    out_tmp = args.output + ".tmp"
    written = 0
    try:
        with open(args.input, encoding="utf-8") as src, open(out_tmp, "w", encoding="utf-8") as dst:
            for lineno, line in enumerate(src, 1):
                if not line.strip():
                    continue
                where = f"{args.input}:{lineno}"
                try:
                    rec = json.loads(line)
                    if not isinstance(rec, dict):
                        raise ValueError("a record must be a JSON object")
                    unknown = set(rec) - {"prompt", "completion", "messages"}
                    if unknown:
                        raise ValueError(f"unknown key {sorted(unknown)[0]!r} (prompt and completion, or messages)")
                    if "messages" in rec:
                        if set(rec) != {"messages"} or not isinstance(rec["messages"], list):
                            raise ValueError("'messages' must be a list, alone in its record")
                        ids, mask = t.chat(rec["messages"])
                    elif isinstance(rec.get("prompt"), str) and isinstance(rec.get("completion"), str):
                        ids, mask = t.text(rec["prompt"], rec["completion"])
                    elif isinstance(rec.get("prompt"), list) and isinstance(rec.get("completion"), list):
                        ids, mask = t.chat(rec["prompt"] + rec["completion"])
                    else:
                        raise ValueError("needs 'prompt' and 'completion' (both strings or both message lists)")
                    if sum(mask[1:]) == 0:
                        raise ValueError("no token counts in the loss (no message of a --loss-roles role)")
                except (ValueError, TypeError, json.JSONDecodeError) as e:
                    fail(f"{where}: {e}")
                dst.write(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n")
                written += 1
            dst.flush()
            os.fsync(dst.fileno())
        if written == 0:
            fail(f"{args.input}: no records")
        os.replace(out_tmp, args.output)
    except OSError as e:
        fail(f"{e.filename or args.output}: {e.strerror}")
    finally:
        if os.path.exists(out_tmp):
            os.remove(out_tmp)
    print(f"tokenize_jsonl: {written} records -> {args.output}", file=sys.stderr)


if __name__ == "__main__":
    main()
