"""`rose-ray serve` as a real process on 127.0.0.1: bad input, clients that hang up, mixed load.

Every bad request gets its 4xx with a message that says what was wrong, good requests keep
being answered (with the same tokens) in between and afterwards, and the server neither dies
nor logs a traceback. bench/serve_load.py measures the same under heavier load.
"""

from __future__ import annotations

import json

from rose_ray.inference.protocol import MAX_PROMPTS, max_body_bytes


def test_the_body_limit_fits_the_largest_valid_request():
    for context in (256, 4096, 16384):
        # Qwen3's largest id has 6 digits; every prompt full; text as JSON-escaped CJK (one token
        # a character, 6 bytes each).
        ids = json.dumps({"prompt": [[151_935] * context] * MAX_PROMPTS, "max_tokens": 0, "echo": True,
                          "logprobs": 0, "prompt_logprobs": 0, "return_tokens_as_token_ids": True})
        text = json.dumps({"messages": [{"role": "user", "content": "\u6c34" * context}]})
        assert len(ids) < max_body_bytes(context) and len(text) < max_body_bytes(context)
    assert max_body_bytes(16384) < 10 * 2**20  # the serve default (the card's context): far under the old 64 MiB


