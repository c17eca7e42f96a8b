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

Edit mode (``mode: edit``), for instruction-editing models: each request carries two images, the prompt's source
image (``metadata["source_image"]``, ``flowzoo/source_images.py``; missing is a one-line ConfigError) and then the
sample, with the instruction formatted into ``EDIT_TEMPLATE``, and the reply gives two scores, instruction following
and preservation. The protocol is UnifiedReward-Edit's pointwise instruction-following one
(``UnifiedReward-Edit/edit_pointwise_instruction_following.py`` in the UnifiedReward repository, CodeGoat24/UnifiedReward):
original image first, edited image second, two scores from 0 to 25, the first for how well the edit follows the
instruction, the second for over-editing (25: a minimal edit of the original), answered as ``"score": [s1, s2]``.
``EDIT_TEMPLATE`` is our wording of that protocol (give ``template`` to send the model's own prompt verbatim).

* parsing rule: the last ``score: [a, b]`` list of the reply (``score`` in any case, then any quotes or colons); each number must lie in
  [0, max_score] (``max_score`` = 25 in edit mode); the terms are ``a / max_score`` (component ``edit``) and
  ``b / max_score`` (component ``preserve``); the score is their weighted mean (``edit_weight``, ``preserve_weight``,
  0.5 / 0.5: ``rewards/edit_score.py``). A reply without such a list is an error, retried like any other.

``template`` and ``max_score`` left unset are the mode's (``DEFAULT_TEMPLATE`` and 5, ``EDIT_TEMPLATE`` and 25).

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
from flowzoo.rewards.edit_score import EDIT_WEIGHT, PRESERVE_WEIGHT, check_weights, edit_output, source_image
from flowzoo.rewards.errors import RewardError
from flowzoo.rewards.weights import to_pil_images

DEFAULT_TEMPLATE = (
    "You are given a text caption and an image generated from it. Judge how well the image matches the caption "
    "and how good the image is overall. Caption: {prompt}\n"
    "Explain briefly, then end with one line 'Final Score: X' where X is a number from 1 to 5."
)
EDIT_TEMPLATE = (
    "You judge an image edit. The first image is the original; the second is the original edited by an AI model "
    "following the instruction below (the two may look the same when the edit failed). Give two scores from 0 to "
    "25. The first rates how completely the second image carries out the instruction (0: not at all, 25: "
    "perfectly). The second rates over-editing (0: the second image is an entirely different scene, 25: it is the "
    "original changed only as the instruction asks). Keep your reasoning short and end with one line "
    "'\"score\": [first, second]'.\nEditing instruction: {prompt}"
)
MODES = ("image", "edit")
#: mode -> (template, max_score) when the config leaves them unset
MODE_DEFAULTS = {"image": (DEFAULT_TEMPLATE, 5.0), "edit": (EDIT_TEMPLATE, 25.0)}
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_SCORE_LIST = re.compile(r"score\W*\[\s*([-+]?\d+(?:\.\d+)?)\s*,\s*([-+]?\d+(?:\.\d+)?)\s*\]", re.IGNORECASE)
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


def _scaled(value: str, max_score: float, reply: str) -> float:
    number = float(value)
    if not 0 <= number <= max_score:
        raise ValueError(f"score {number} outside [0, {max_score}] in the reply {reply[:200]!r}")
    return number / max_score


def parse_score(reply: str, max_score: float) -> float:
    """The number after 'Final Score' (else the first number) divided by max_score; ValueError when impossible."""
    marker = _FINAL_SCORE.search(reply)
    match = _NUMBER.search(reply, marker.end() if marker else 0)
    if match is None:
        raise ValueError(f"no number in the reply {reply[:200]!r}")
    return _scaled(match.group(), max_score, reply)


def parse_edit_scores(reply: str, max_score: float) -> tuple[float, float]:
    """Edit mode: the last ``score ... [a, b]`` of the reply as (a, b) / max_score; ValueError when impossible."""
    matches = list(_SCORE_LIST.finditer(reply))
    if not matches:
        raise ValueError(f"no score list [instruction following, preservation] in the reply {reply[:200]!r}")
    return tuple(_scaled(value, max_score, reply) for value in matches[-1].groups())


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
    """A VLM judge behind an OpenAI-compatible chat server (UnifiedReward or any other): a sample against its prompt,
    or in edit mode an edited sample against its source image (instruction following and preservation).

    ``template`` and ``max_score`` left unset are the mode's; the rest: the module docstring."""

    accepts = ("image",)

    secret_args = ("api_key",)  # never written out (flowzoo/secrets.py), whatever its name

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080/v1",
        model: str = "UnifiedReward-qwen-7b",
        timeout: float = 60.0,
        retries: int = 2,
        retry_wait_s: float = 1.0,
        max_score: float | None = None,
        max_concurrency: int = 8,
        max_tokens: int = 512,
        template: str | None = None,
        api_key: str | None = None,
        api_key_env: str | None = None,
        max_response_bytes: int = 1_000_000,
        mode: str = "image",
        edit_weight: float = EDIT_WEIGHT,
        preserve_weight: float = PRESERVE_WEIGHT,
    ):
        check_base_url(base_url)
        if mode not in MODES:
            raise ConfigError(f"unifiedreward reward: mode {mode!r} is not one of {', '.join(MODES)}")
        self.mode = mode
        self.weights = check_weights(edit_weight, preserve_weight, self.name)
        template = MODE_DEFAULTS[mode][0] if template is None else template
        max_score = MODE_DEFAULTS[mode][1] if max_score is None else max_score
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
        return f"UnifiedReward(url={self.url!r}, model={self.model!r}, mode={self.mode!r}, api_key={key!r})"

    def request_body(self, images: Sequence[Any], prompt: str) -> bytes:
        """One chat request: the images in order (edit mode: source, then sample), then the formatted template."""
        parts = [{"type": "image_url", "image_url": {"url": png_data_url(image)}} for image in images]
        message = {"role": "user", "content": [*parts, {"type": "text", "text": self.template.format(prompt=prompt)}]}
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

    def parse(self, reply: str) -> float | tuple[float, float]:
        """The reply's score (image mode) or (instruction following, preservation) (edit mode), each in [0, 1]."""
        if self.mode == "edit":
            return parse_edit_scores(reply, self.max_score)
        return parse_score(reply, self.max_score)

    def judge(self, images: Sequence[Any], prompt: str) -> float | tuple[float, float]:
        """One request (retried as the module docstring says) and its parsed reply."""
        headers = {"Content-Type": "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        body = self.request_body(images, prompt)
        cause = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.retry_wait_s * 2 ** (attempt - 1))
            try:
                request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                reply = self._read_reply(request, deadline=time.monotonic() + self.timeout)
                return self.parse(reply_text(reply))
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
        images = [[image] for image in to_pil_images(samples, self.name)]
        if self.mode == "edit":  # every source is read (a missing one is an error) before any request is sent
            sources = [to_pil_images(source_image(meta, prompt, self.name)[None], self.name)[0]
                       for prompt, meta in zip(prompts, metadata)]
            images = [[source, *image] for source, image in zip(sources, images)]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(images)) or 1) as pool:
            scores = torch.tensor(list(pool.map(self.judge, images, prompts)), dtype=torch.float32)
        if self.mode == "edit":
            return edit_output(scores[:, 0], scores[:, 1], self.weights)
        return RewardOutput(scores)
