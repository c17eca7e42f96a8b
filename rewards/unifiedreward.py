"""``unifiedreward``: a client for a vision-language reward model served behind an OpenAI-compatible API.

UnifiedReward (Wang et al. 2025) and similar VLM judges are served with vLLM / SGLang as
``POST {base_url}/chat/completions``. For every sample this client sends one request with the image as a base64 PNG
data URL and a text instruction (``template``, formatted with the prompt), and parses the reply:

* parsing rule: if the reply contains ``Final Score`` (any case), the first number after it is the score, else the
  first number anywhere in the reply; the reward is ``number / max_score`` (``max_score`` = 5 by default, so a
  1-5 rating becomes 0.2-1.0). A reply without a number, or with one outside [0, max_score], is an error.
* failures (connection refused, timeout, HTTP errors, redirects, a reply over ``max_response_bytes``, malformed
  JSON or reply) are retried ``retries`` times with ``retry_wait_s * 2**attempt`` seconds between tries, then raise
  :class:`RewardError` naming the reward, the URL and the cause. A sample is never silently scored 0.

Bounds: an attempt ends when the server sends nothing for ``timeout`` seconds (connecting, waiting for the answer,
each read) or when the body is still arriving ``timeout`` seconds after the request was sent; a body over
``max_response_bytes`` (1 MB; a chat completion is a few kB) is refused; redirects are not followed (they would
carry the key to another address). A config takes ``timeout`` <= 3600 s, ``retries`` <= 10 and ``retry_wait_s``
<= 600 s (``benchmark/config/argument_ranges.py``), so a sample's wait is bounded.

The key: ``api_key_env: VARIABLE`` (read at run time; the default variable is ``FLOWZOO_UNIFIEDREWARD_API_KEY``)
or a literal ``api_key`` (warned about; stored as ``***``). It is sent only as the ``Authorization`` header and
never appears in an error message (``flowzoo/secrets.py``). ``base_url`` must be ``http(s)://host[:port][/path]``
without credentials, query or fragment.

Only the standard library is used (urllib, json, base64). Requests of a batch run concurrently
(``max_concurrency`` threads) since they are network-bound.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from flowzoo.errors import ConfigError
from flowzoo.secrets import REDACTED, scrub, secret_value
from flowzoo.rewards import register
from flowzoo.rewards.base import Reward, RewardOutput
from flowzoo.rewards.errors import RewardError
from flowzoo.rewards.weights import to_pil_images

DEFAULT_TEMPLATE = (
    "You are given a text caption and an image generated from it. Judge how well the image matches the caption "
    "and how good the image is overall. Caption: {prompt}\n"
    "Explain briefly, then end with one line 'Final Score: X' where X is a number from 1 to 5."
)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_FINAL_SCORE = re.compile(r"final\s*score", re.IGNORECASE)
DEFAULT_KEY_VARIABLE = "FLOWZOO_UNIFIEDREWARD_API_KEY"
READ_CHUNK_BYTES = 65536


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx answer stays an HTTPError: following it would send the Authorization header elsewhere."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


def check_base_url(base_url: Any) -> str:
    """``http(s)://host[:port][/path]``; the error never echoes credentials or a query (they may hold a key)."""
    try:
        parts = urllib.parse.urlsplit(base_url) if isinstance(base_url, str) else None
        port = parts and parts.port
    except ValueError:  # a port that is not a number
        parts = port = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        shown = REDACTED if "@" in str(base_url) or "?" in str(base_url) else base_url
        raise ConfigError(f"unifiedreward reward: base_url must be http://host[:port]/path or https://..., "
                          f"got {shown!r}")
    if "@" in parts.netloc or parts.query or parts.fragment:
        safe = urllib.parse.urlunsplit((parts.scheme, parts.hostname + (f":{port}" if port else ""),
                                        parts.path, "", ""))
        raise ConfigError(f"unifiedreward reward: base_url {safe!r} must carry no credentials, query or fragment; "
                          f"give the key as api_key_env: VARIABLE")
    return base_url


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
    accepts = ("image",)

    secret_args = ("api_key",)  # never written out (flowzoo/secrets.py), whatever its name

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
        api_key_env: str | None = None,
        max_response_bytes: int = 1_000_000,
    ):
        check_base_url(base_url)
        if retries < 0 or timeout <= 0 or max_score <= 0 or max_concurrency < 1 or max_response_bytes < 1:
            raise ConfigError(
                f"unifiedreward reward: need retries >= 0, timeout > 0, max_score > 0, max_concurrency >= 1, "
                f"max_response_bytes >= 1; got retries={retries}, timeout={timeout}, max_score={max_score}, "
                f"max_concurrency={max_concurrency}, max_response_bytes={max_response_bytes}"
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
        self.max_response_bytes = int(max_response_bytes)
        self._api_key = secret_value(api_key, api_key_env, DEFAULT_KEY_VARIABLE, "unifiedreward reward", "api_key")

    def __repr__(self) -> str:
        key = REDACTED if self._api_key else None
        return f"UnifiedReward(url={self.url!r}, model={self.model!r}, api_key={key!r})"

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

    def _read_reply(self, request: urllib.request.Request, deadline: float) -> bytes:
        """The response body, refused when it exceeds max_response_bytes or arrives after the deadline."""
        with _OPENER.open(request, timeout=self.timeout) as response:
            chunks, size = [], 0
            while chunk := response.read(min(READ_CHUNK_BYTES, self.max_response_bytes + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
                if size > self.max_response_bytes:
                    raise ValueError(f"reply larger than max_response_bytes={self.max_response_bytes}")
                if time.monotonic() > deadline:
                    raise TimeoutError
            return b"".join(chunks)

    def score_one(self, image: Any, prompt: str) -> float:
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        body = self.request_body(image, prompt)
        cause = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.retry_wait_s * 2 ** (attempt - 1))
            try:
                request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                reply = self._read_reply(request, deadline=time.monotonic() + self.timeout)
                return parse_score(reply_text(reply), self.max_score)
            except TimeoutError:
                cause = f"timed out after {self.timeout:g} s"
            except urllib.error.HTTPError as e:
                redirect = " (redirects are not followed)" if 300 <= e.code < 400 else ""
                cause = f"HTTP {e.code} {e.reason}{redirect}"
            except urllib.error.URLError as e:
                reason = e.reason
                timed_out = isinstance(reason, TimeoutError)
                cause = f"timed out after {self.timeout:g} s" if timed_out else f"cannot reach server: {reason}"
            except (ValueError, OSError, http.client.HTTPException) as e:  # malformed reply, dropped connection
                cause = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
        tries = f"{self.retries + 1} attempt{'s' if self.retries else ''}"
        message = f"reward 'unifiedreward': request to {self.url} failed after {tries}: {cause}"
        raise RewardError(scrub(message, self._api_key))

    def score(self, samples: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        images = to_pil_images(samples, self.name)
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(images)) or 1) as pool:
            scores = list(pool.map(self.score_one, images, prompts))
        return RewardOutput(torch.tensor(scores, dtype=torch.float32))
