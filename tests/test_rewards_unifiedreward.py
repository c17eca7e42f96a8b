"""The unifiedreward client against a fake OpenAI-compatible server on 127.0.0.1."""

import base64
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from PIL import Image

from flowzoo import rewards
from flowzoo.errors import ConfigError
from flowzoo.rewards.errors import RewardError
from flowzoo.rewards.unifiedreward import DEFAULT_KEY_VARIABLE, UnifiedReward, parse_score


class FakeServer:
    """Answers POST /v1/chat/completions with ``self.reply(request_json)`` -> (status, body bytes) or (status, body,
    {"reason": phrase, "headers": {...}}), optionally late; records each request and its headers."""

    def __init__(self):
        self.requests = []
        self.headers = []
        self.delay_s = 0.0
        self.reply = lambda request: (200, chat_response("Final Score: 4"))
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append((self.path, request))
                server.headers.append(dict(self.headers))
                time.sleep(server.delay_s)
                status, body, *extra = server.reply(request)
                extra = extra[0] if extra else {}
                try:
                    self.send_response(status, extra.get("reason"))
                    for name, value in extra.get("headers", {}).items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()


def chat_response(text):
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()


@pytest.fixture
def server():
    fake = FakeServer()
    yield fake
    fake.httpd.shutdown()
    fake.httpd.server_close()


def images(n=2):
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))


def test_parse_rule():
    assert parse_score("Alignment 3/5 ... Final Score: 4.5", 5) == pytest.approx(0.9)  # number after the marker
    assert parse_score("I rate it 2 out of 5.", 5) == pytest.approx(0.4)  # else the first number
    with pytest.raises(ValueError, match="no number"):
        parse_score("looks nice", 5)
    with pytest.raises(ValueError, match="outside"):
        parse_score("Final Score: 7", 5)


def caption_of(request):
    """The prompt the client formatted into its instruction ('... Caption: {prompt}\n...')."""
    text = request["messages"][0]["content"][1]["text"]
    return text.split("Caption: ")[1].split("\n")[0]


def test_good_reply_scores_and_sends_image_and_prompt(server):
    replies = {"a red cat": "Reasoning... Final Score: 4", "a blue dog": "final score - 2.5"}
    server.reply = lambda request: (200, chat_response(replies[caption_of(request)]))
    reward = rewards.build("unifiedreward", {"unifiedreward": {"base_url": server.base_url, "model": "judge"}})
    samples = images()
    out = reward(samples, ["a red cat", "a blue dog"])
    assert out.score.tolist() == pytest.approx([0.8, 0.5])  # 4/5 and 2.5/5, in prompt order
    for path, request in server.requests:
        assert path == "/v1/chat/completions" and request["model"] == "judge"
        url = request["messages"][0]["content"][0]["image_url"]["url"]
        assert url.startswith("data:image/png;base64,")
        png = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).convert("RGB")
        sent = torch.from_numpy(np.asarray(png).copy()).permute(2, 0, 1)
        index = ["a red cat", "a blue dog"].index(caption_of(request))
        assert torch.equal(sent, (samples[index] * 255).round().byte())  # lossless PNG of the right sample


def test_timeout_is_an_error_naming_reward_and_cause(server):
    server.delay_s = 1.0
    reward = UnifiedReward(base_url=server.base_url, timeout=0.2, retries=0)
    with pytest.raises(RewardError, match="unifiedreward.*timed out after 0.2 s"):
        reward(images(1), ["a cat"])


@pytest.mark.parametrize(
    "status,body,cause",
    [
        (200, b"not json", "malformed"),
        (200, json.dumps({"choices": []}).encode(), "malformed"),
        (200, chat_response("a lovely picture"), "no number"),
        (500, b"{}", "HTTP 500"),
    ],
)
def test_malformed_reply_is_a_clear_error(server, status, body, cause):
    server.reply = lambda req: (status, body)
    reward = UnifiedReward(base_url=server.base_url, retries=1, retry_wait_s=0.01)
    with pytest.raises(RewardError, match=f"unifiedreward.*2 attempts.*{cause}"):
        reward(images(1), ["a cat"])
    assert len(server.requests) == 2  # retried once


def test_retry_recovers_from_a_transient_failure(server):
    calls = []
    server.reply = lambda req: calls.append(1) or ((503, b"{}") if len(calls) == 1 else (200, chat_response("5")))
    reward = UnifiedReward(base_url=server.base_url, retries=1, retry_wait_s=0.01)
    assert reward(images(1), ["a cat"]).score.tolist() == [1.0]


def test_unreachable_server_and_bad_config():
    with pytest.raises(RewardError, match="cannot reach server"):
        UnifiedReward(base_url="http://127.0.0.1:9/v1", retries=0, timeout=2)(images(1), ["a cat"])
    for url in ("localhost:8000", "file:///etc/passwd", "ftp://host/v1", "http:///v1", "http://host:port/v1"):
        with pytest.raises(ConfigError, match="base_url must be http"):
            UnifiedReward(base_url=url)


KEY = "sk-test-3f9a1c7e5b"


def test_key_sources_and_their_errors(server, monkeypatch):
    monkeypatch.delenv(DEFAULT_KEY_VARIABLE, raising=False)
    monkeypatch.delenv("JUDGE_KEY", raising=False)
    assert "Authorization" not in _sent_headers(server, UnifiedReward(base_url=server.base_url))  # no key: none sent
    monkeypatch.setenv(DEFAULT_KEY_VARIABLE, "from-default-variable")
    default = UnifiedReward(base_url=server.base_url)
    assert _sent_headers(server, default)["Authorization"] == "Bearer from-default-variable"
    monkeypatch.setenv("JUDGE_KEY", KEY)
    reward = UnifiedReward(base_url=server.base_url, api_key_env="JUDGE_KEY")  # the named variable wins
    assert _sent_headers(server, reward)["Authorization"] == f"Bearer {KEY}" and KEY not in repr(reward)
    literal = UnifiedReward(base_url=server.base_url, api_key="sk-literal")
    assert _sent_headers(server, literal)["Authorization"] == "Bearer sk-literal"
    monkeypatch.delenv("JUDGE_KEY")
    with pytest.raises(ConfigError, match="api_key_env names the environment variable JUDGE_KEY, which is not set"):
        UnifiedReward(base_url=server.base_url, api_key_env="JUDGE_KEY")
    with pytest.raises(ConfigError, match="give api_key or api_key_env, not both"):
        UnifiedReward(base_url=server.base_url, api_key=KEY, api_key_env="JUDGE_KEY")
    with pytest.raises(ConfigError, match="redacted copy"):  # a run's config.yaml reused as a config
        UnifiedReward(base_url=server.base_url, api_key="***")


def _sent_headers(server, reward):
    reward(images(1), ["a cat"])
    return server.headers[-1]


def test_credentials_in_base_url_are_refused_without_echoing_them():
    for url in (f"https://user:{KEY}@judge.example/v1", f"https://judge.example/v1?api-key={KEY}"):
        with pytest.raises(ConfigError, match="no credentials, query or fragment") as error:
            UnifiedReward(base_url=url)
        assert KEY not in str(error.value) and "https://judge.example/v1" in str(error.value)
    with pytest.raises(ConfigError) as error:
        UnifiedReward(base_url=f"http://u:{KEY}@judge.example:port/v1")
    assert KEY not in str(error.value)


def test_no_key_in_error_text_even_when_the_server_echoes_it(server):
    server.reply = lambda req: (401, b"{}", {"reason": f"bad key {server.headers[-1]['Authorization']}"})
    reward = UnifiedReward(base_url=server.base_url, api_key=KEY, retries=0)
    with pytest.raises(RewardError, match=r"HTTP 401 bad key Bearer \*\*\*") as error:
        reward(images(1), ["a cat"])
    assert KEY not in str(error.value)


def test_a_reply_over_the_size_cap_is_refused(server):
    server.reply = lambda req: (200, chat_response("Final Score: 4" + " " * 5000))
    reward = UnifiedReward(base_url=server.base_url, retries=0, max_response_bytes=4096)
    with pytest.raises(RewardError, match="reply larger than max_response_bytes=4096"):
        reward(images(1), ["a cat"])
    roomy = UnifiedReward(base_url=server.base_url, max_response_bytes=8192)
    assert roomy(images(1), ["a cat"]).score.tolist() == pytest.approx([0.8])


def test_redirects_are_not_followed(server):
    elsewhere = FakeServer()
    try:
        target = elsewhere.base_url + "/chat/completions"
        server.reply = lambda req: (302, b"{}", {"headers": {"Location": target}})
        reward = UnifiedReward(base_url=server.base_url, api_key=KEY, retries=0)
        with pytest.raises(RewardError, match="HTTP 302 .*redirects are not followed"):
            reward(images(1), ["a cat"])
        assert elsewhere.requests == []  # neither the request nor the key went to the other address
    finally:
        elsewhere.httpd.shutdown()
        elsewhere.httpd.server_close()
