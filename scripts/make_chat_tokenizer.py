#!/usr/bin/env python3
"""tests/fixtures/tiny-text-chat/tokenizer.json: the tiny-text fixture's
word-level tokenizer with Gemma 4's two turn tokens, <|turn> at id 500 and
<turn|> at id 501 (in place of the words w500 and w501), as special added
tokens. The chat tests run the tiny-text checkpoint with it (the fixture's
own tokenizer has no turn tokens, which the chat code refuses).

    python3 scripts/make_chat_tokenizer.py
"""
import json
import pathlib

root = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
tok = json.loads((root / "tiny-text" / "tokenizer.json").read_text())
for token_id, content in [(500, "<|turn>"), (501, "<turn|>")]:
    vocab = tok["model"]["vocab"]
    for word in [w for w, i in vocab.items() if i == token_id]:
        del vocab[word]
    vocab[content] = token_id
    tok["added_tokens"].append({
        "id": token_id, "content": content, "single_word": False, "lstrip": False,
        "rstrip": False, "normalized": False, "special": True,
    })
out = root / "tiny-text-chat"
out.mkdir(exist_ok=True)
(out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=2) + "\n")
