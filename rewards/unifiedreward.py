"""``unifiedreward``: a client for a vision-language reward model served behind an OpenAI-compatible API.

UnifiedReward (Wang et al. 2025) and similar VLM judges are served with vLLM / SGLang as
``POST {base_url}/chat/completions``. For every sample this client sends one request with the image as a base64 PNG
data URL and a text instruction (``template``, formatted with the prompt), and parses the reply:

* parsing rule: if the reply contains ``Final Score`` (any case), the first number after it is the score, else the
  first number anywhere in the reply; the reward is ``number / max_score`` (``max_score`` = 5 by default, so a
  1-5 rating becomes 0.2-1.0). A reply without a number, or with one outside [0, max_score], is an error.
* failures (connection refused, timeout, HTTP errors, malformed JSON or reply) are retried ``retries`` times with
  ``retry_wait_s * 2**attempt`` seconds between tries, then raise :class:`RewardError` naming the reward, the URL
  and the cause. A sample is never silently scored 0.

Only the standard library is used (urllib, json, base64). Requests of a batch run concurrently
(``max_concurrency`` threads) since they are network-bound.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from flowzoo.errors import ConfigError
from rewards import register
from rewards.base import Reward, RewardOutput
from rewards.errors import RewardError
from rewards.weights import to_pil_images

DEFAULT_TEMPLATE = (
    "You are given a text caption and an image generated from it. Judge how well the image matches the caption "
    "and how good the image is overall. Caption: {prompt}\n"
    "Explain briefly, then end with one line 'Final Score: X' where X is a number from 1 to 5."
)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_FINAL_SCORE = re.compile(r"final\s*score", re.IGNORECASE)


def parse_score(reply: str, max_score: float) -> float:
    """The number after 'Final Score' (else the first number) divided by max_score; ValueError when impossible."""
    marker = _FINAL_SCORE.search(reply)
    match = _NUMBER.search(reply, marker.end() if marker else 0)
    if match is None:
        raise ValueError(f"no number in the reply {reply[:200]!r}")
    value = float(match.group())
    if not 0 <= value <= max_score:
        raise ValueError(f"score {value} outside [0, {max_score}] in the reply {reply[:200]!r}")
    return value / max_score


def png_data_url(image: Any) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def reply_text(body: bytes) -> str:
    """``choices[0].message.content`` of a chat-completions response (text parts joined when it is a list)."""
    try:
        content = json.loads(body)["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise ValueError(f"malformed chat-completions response ({type(e).__name__}: {e}): {body[:200]!r}") from None
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    if not isinstance(content, str):
        raise ValueError(f"malformed chat-completions response: content is {type(content).__name__}")
    return content


@register("unifiedreward")
class UnifiedReward(Reward):
    name = "unifiedreward"
    accepts = ("image",)

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080/v1",
        model: str = "UnifiedReward-qwen-7b",
        timeout: float = 60.0,
        retries: int = 2,
        retry_wait_s: float = 1.0,
        max_score: float = 5.0,
        max_concurrency: int = 8,
        max_tokens: int = 512,
        template: str = DEFAULT_TEMPLATE,
        api_key: str | None = None,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"unifiedreward reward: base_url must start with http:// or https://, got {base_url!r}")
        if retries < 0 or timeout <= 0 or max_score <= 0 or max_concurrency < 1:
            raise ConfigError(
                f"unifiedreward reward: need retries >= 0, timeout > 0, max_score > 0, max_concurrency >= 1; got "
                f"retries={retries}, timeout={timeout}, max_score={max_score}, max_concurrency={max_concurrency}"
            )
        if "{prompt}" not in template:
            raise ConfigError("unifiedreward reward: template must contain '{prompt}'")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.retry_wait_s = float(retry_wait_s)
        self.max_score = float(max_score)
        self.max_concurrency = int(max_concurrency)
        self.max_tokens = int(max_tokens)
        self.template = template
        self.api_key = api_key if api_key is not None else os.environ.get("FLOWZOO_UNIFIEDREWARD_API_KEY")

    def request_body(self, image: Any, prompt: str) -> bytes:
        message = {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": png_data_url(image)}},
                {"type": "text", "text": self.template.format(prompt=prompt)},
            ],
        }
        body = {"model": self.model, "messages": [message], "temperature": 0.0, "max_tokens": self.max_tokens}
        return json.dumps(body).encode("utf-8")

    def score_one(self, image: Any, prompt: str) -> float:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        body = self.request_body(image, prompt)
        cause = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.retry_wait_s * 2 ** (attempt - 1))
            try:
                request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return parse_score(reply_text(response.read()), self.max_score)
            except TimeoutError:
                cause = f"timed out after {self.timeout:g} s"
            except urllib.error.HTTPError as e:
                cause = f"HTTP {e.code} {e.reason}"
            except urllib.error.URLError as e:
                reason = e.reason
                timed_out = isinstance(reason, TimeoutError)
                cause = f"timed out after {self.timeout:g} s" if timed_out else f"cannot reach server: {reason}"
            except ValueError as e:
                cause = str(e)
        tries = f"{self.retries + 1} attempt{'s' if self.retries else ''}"
        raise RewardError(f"reward 'unifiedreward': request to {self.url} failed after {tries}: {cause}")

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        images = to_pil_images(samples, self.name)
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(images)) or 1) as pool:
            scores = list(pool.map(self.score_one, images, prompts))
        return RewardOutput(torch.tensor(scores, dtype=torch.float32))
