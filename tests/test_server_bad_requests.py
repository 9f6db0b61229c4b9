"""`streamer serve` refusing what clients get wrong: each bad request an OpenAI error naming the
field, malformed bodies and connections answered, and no traceback in the server's log."""

from __future__ import annotations

import json
import socket
import struct
import time
from urllib.parse import urlsplit

import openai
import pytest
from serving import CONTEXT, HELLO, WEATHER, connection, request


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b"\xff\xfe", 400, "UTF-8"),
        (b'{"model": "M", "messages": [], "max_tokens": 2}', 400, "messages"),
        (b'{"model": "M", "messages": [{"role": "x", "content": "hi"}]}', 400, "role"),
        (b'{"model": "M", "messages": [{"role": "user", "content": 5}]}', 400, "content"),
        (b'{"model": 5, "messages": [{"role": "user", "content": "hi"}]}', 400, "model"),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
            400,
            "temperature",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "top_p": 2}',
            400,
            "top_p",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}',
            400,
            "max_tokens",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}',
            400,
            "context",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "seed": 1.5}',
            400,
            "seed",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}',
            400,
            "logprobs",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            400,
            "JSON",
        ),
        (b'{"model": "M", "prompt": [99999]}', 400, "token ids"),
        # a repeated key: json.loads kept the last value, a gateway in front may read the first
        (b'{"prompt": "hi", "max_tokens": 1, "max_tokens": 900}', 400, "repeats the key 'max_"),
        (  # JSON's 1e400 is Python's inf
            b'{"model": "M", "messages": [{"role": "user", "content": "x"}], "temperature": 1e400}',
            400,
            "temperature",
        ),
    ],
)
def test_bad_requests_get_openai_errors(server, served_folder, body, status, words):
    path = "/v1/completions" if b'"prompt"' in body else "/v1/chat/completions"
    got, answer = request(
        server[0], "POST", path, body.replace(b'"M"', json.dumps(str(served_folder)).encode())
    )
    assert got == status, answer
    error = answer["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error"


HI = [{"role": "user", "content": "hi"}]
CALLED = {"role": "assistant", "content": None}


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"seed": -(2**63) - 1}, "seed must lie in [-9223372036854775808, "),
        ({"seed": 2**64}, "seed"),
        ({"max_tokens": 2**70}, "max_tokens"),
        ({"top_k": 10**20}, "top_k"),
        ({"temperature": 1e-300}, "temperature"),
        ({"repetition_penalty": 1e308}, "repetition_penalty"),
        ({"repetition_penalty": 0.001}, "repetition_penalty must be 0 (off) or lie in"),
        ({"repetition_penalty": -1}, "repetition_penalty"),
        ({"presence_penalty": 2**2000}, "presence_penalty"),
        ({"logit_bias": {"99999999999999999999999": 1}}, "logit_bias"),
        ({"logit_bias": {"1": "x"}}, "logit_bias"),
        ({"logit_bias": {"1.5": 1}}, "logit_bias"),
        ({"logit_bias": {"99999": 1}}, "past the model's vocabulary"),
        ({"logit_bias": {"99999": 1}, "stream": True}, "past the model's vocabulary"),
        ({"stop": ["a", 5]}, "stop"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"stop": "x" * 1001}, "stop"),
        ({"stop": {"a": 1}}, "stop"),
        ({"logprobs": 1}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"stream": "yes"}, "stream"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
        ({"stream_options": []}, "stream_options"),
        ({"n": 2}, "n must be 1"),
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}]}, "tools"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"parallel_tool_calls": "no"}, "parallel_tool_calls must be true or false"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": 5}, "chat_template_kwargs"),
        ({"messages": [{"role": "user", "content": "\ud800"}]}, "UTF-8"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text parts"),
        ({"messages": [{"role": "user", "content": "x", "name": 5}]}, "name"),
        ({"messages": [{**CALLED, "tool_calls": 5}]}, "tool_calls"),
        ({"messages": [{**CALLED, "tool_calls": ["x"]}]}, "tool_calls[0]"),
        ({"messages": [{**CALLED, "tool_calls": [{"function": None}]}]}, "tool_calls[0]"),
        (
            {"messages": [{**CALLED, "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]},
            "arguments",
        ),
        (
            {
                "messages": [
                    {**CALLED, "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}
                ]
            },
            "function.arguments is not JSON",
        ),
        *(  # arguments as a JSON string nested past what json.loads (or the template) takes:
            # a 500 and a traceback before
            (
                {
                    "messages": [
                        {**CALLED, "tool_calls": [{"function": {"name": "f", "arguments": deep}}]}
                    ]
                },
                "function.arguments nests arrays or objects over 64 deep",
            )
            for deep in ("[" * 2000 + "]" * 2000, '{"a": ' * 900 + "1" + "}" * 900)
        ),
        ({"messages": [{"role": "user"}]}, "messages[0].content is required"),
        ({"messages": [*HI, {"role": "assistant"}]}, "messages[1].content (or tool_calls)"),
    ],
)
def test_every_field_is_checked(server, served_folder, fields, words):
    """Each bad value a 4xx naming the field, streamed or not: never a 500 or a lost connection."""
    body = {"model": str(served_folder), "messages": HI, "max_tokens": 2, **fields}
    got, answer = request(server[0], "POST", "/v1/chat/completions", json.dumps(body).encode())
    assert got == 400, answer
    message = answer["error"]["message"]
    assert words in message, answer
    assert message.count("{") == message.count("}"), message  # no stray braces


@pytest.mark.parametrize(
    "path, fields, param",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content"),
        ("/v1/chat/completions", {"messages": [*HI, 5]}, "messages[1]"),
        ("/v1/chat/completions", {"messages": [{"role": "x"}]}, "messages[0].role"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{**CALLED, "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]},
            "messages[0].tool_calls[0].function.arguments",
        ),
        ("/v1/chat/completions", {"tools": [*[WEATHER] * 2, 5]}, "tools[2]"),
        ("/v1/chat/completions", {"max_completion_tokens": 5000}, "max_completion_tokens"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x " * 2000}]},
            "messages",
        ),
        ("/v1/chat/completions", {"stream_options": {}}, "stream_options"),
        ("/v1/chat/completions", {"model": 5}, "model"),
        ("/v1/completions", {"prompt": "x " * 2000}, "prompt"),
        ("/v1/completions", {"max_tokens": 5000}, "max_tokens"),
        ("/v1/completions", {"suffix": "x"}, "suffix"),
    ],
)
def test_errors_name_the_field_of_the_endpoint(server, served_folder, path, fields, param):
    body = {"model": "any", "max_tokens": 2, **fields}
    body.setdefault("messages" if "chat" in path else "prompt", HI if "chat" in path else "hi")
    got, answer = request(server[0], "POST", path, json.dumps(body).encode())
    assert got == 400 and answer["error"]["param"] == param, answer


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"prompt": [[1, 2], [3]]}, "one prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": [True]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": 21}, "logprobs"),
        ({"echo": True}, "echo"),
        ({"best_of": 3}, "best_of"),
        ({"seed": 2**64}, "seed"),
    ],
)
def test_every_text_completion_field_is_checked(server, served_folder, fields, words):
    body = {"model": str(served_folder), "prompt": "hi", "max_tokens": 2, **fields}
    got, answer = request(server[0], "POST", "/v1/completions", json.dumps(body).encode())
    assert got == 400, answer
    assert words in answer["error"]["message"], answer


def test_malformed_bodies_and_connections(server, served_folder):
    url = urlsplit(server[0])
    deep = b'{"model": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    assert request(server[0], "POST", "/v1/chat/completions", deep)[0] == 400
    nested = {}  # 900 deep: json.loads takes it, what copies and renders the messages did not
    for _ in range(900):
        nested = {"a": nested}
    message = {"role": "user", "content": "hi", "extra": nested}
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": nested}}
    called = {"role": "assistant", "content": "", "tool_calls": [call]}
    for messages in ([message], [{"role": "user", "content": "hi"}, called]):
        body = json.dumps({"model": "M", "messages": messages, "max_tokens": 1}).encode()
        status, answer = request(server[0], "POST", "/v1/chat/completions", body)
        assert status == 400 and "over 64 deep" in answer["error"]["message"], answer
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: \xc2\xb2\r\n\r\n{}")
        assert s.recv(100).startswith(b"HTTP/1.1 400")  # "\u00b2" is a digit to str.isdigit
    http = connection(server[0])
    for path, status in (("/health", 200), ("/v1/models", 200), ("/v1/nothing", 404)):
        # GET's status and length, no body (uptime monitors probe with HEAD): it was a 405
        http.request("GET", path)
        get = http.getresponse()
        length = str(len(get.read()))
        http.request("HEAD", path)
        head = http.getresponse()
        assert (head.status, head.getheader("Content-Length"), head.read()) == (status, length, b"")
    http.close()
    ok = {"model": str(served_folder), "messages": HI, "max_tokens": 1}
    # a query string (as Azure-style clients add) does not change the route
    status, body = request(server[0], "POST", "/v1/chat/completions?x=1", json.dumps(ok).encode())
    assert status == 200 and body["usage"]["completion_tokens"] == 1
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(  # a body shorter than its Content-Length, then the client closes its side
            b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}"
        )
        s.shutdown(socket.SHUT_WR)
        assert s.recv(100).startswith(b"HTTP/1.1 400")


def test_a_prompt_over_the_context_is_refused_by_the_client(client, served_folder):
    long = [{"role": "user", "content": "word " * CONTEXT}]
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=str(served_folder), messages=long, max_tokens=2)
    assert error.value.code == "context_length_exceeded"


def test_a_number_of_thousands_of_digits_is_refused_in_words_for_the_client(server):
    """Python's own words for it told the client to call sys.set_int_max_str_digits()."""
    body = b'{"prompt": "hi", "seed": 1' + b"0" * 5000 + b"}"
    status, answer = request(server[0], "POST", "/v1/completions", body)
    assert status == 400 and "a number has too many digits" in answer["error"]["message"], answer


def test_unknown_paths_and_missing_length(server):
    assert request(server[0], "GET", "/v1/nothing")[0] == 404
    status, body = request(server[0], "DELETE", "/v1/models")
    assert status == 405 and "DELETE is not allowed on /v1/models: use GET" in str(body)
    status, body = request(server[0], "GET", "/v1/chat/completions")  # was a 404
    assert status == 405 and "GET is not allowed on /v1/chat/completions: use POST" in str(body)
    url = urlsplit(server[0])
    with socket.create_connection((url.hostname, url.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.0\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 411")


@pytest.mark.parametrize(
    "method, path, status, allow",
    [
        ("GET", "/v1/chat/completions", 405, "POST, OPTIONS"),
        ("PUT", "/v1/completions", 405, "POST, OPTIONS"),
        ("POST", "/health", 405, "GET, HEAD, OPTIONS"),  # was a 404
        ("DELETE", "/v1/models", 405, "GET, HEAD, OPTIONS"),
        ("PATCH", "/v1/nothing", 404, None),  # was a 405: nothing is served there
    ],
)
def test_a_405_says_which_methods_are_allowed(server, method, path, status, allow):
    """HTTP requires a 405's Allow header (RFC 9110, 15.5.6): the answers lacked it."""
    http = connection(server[0])
    try:
        http.request(method, path, body=b"{}" if method != "GET" else None)
        response = http.getresponse()
        response.read()
        assert (response.status, response.getheader("Allow")) == (status, allow)
    finally:
        http.close()


@pytest.mark.parametrize(
    "head, status, words",
    [
        (b"TRACE /v1/models HTTP/1.1\r\n", 501, "Unsupported method ('TRACE')"),
        (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n", 414, "Request-URI Too Long"),
        (b"GET /v1/models HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n", 431, "Line too long"),
        (b"GET /v1/models HTTP/1.1\r\n" + b"X: y\r\n" * 101, 431, "Too many headers"),
        # a request line http.server reads as HTTP/0.9's: the answer is a body alone
        (b"GET /v1/models HTTP/1.1 extra\r\n", None, "Bad request version ('extra')"),
    ],
    ids=["method", "long-path", "long-header", "many-headers", "bad-version"],
)
def test_what_http_server_refuses_itself_is_an_openai_error(server, head, status, words):
    """A request line or headers http.server cannot take: it answered with its HTML page."""
    url = urlsplit(server[0])
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(head + b"\r\n")
        answer = s.makefile("rb").read()
    if status is not None:
        headers, _, answer = answer.partition(b"\r\n\r\n")
        assert headers.startswith(b"HTTP/1.1 %d" % status), headers
        assert b"Content-Type: application/json" in headers, headers
    assert words in json.loads(answer)["error"]["message"], answer


def test_clients_that_reset_and_bytes_for_a_terminal_leave_the_log_clean(server, served_folder):
    """A client that resets its connection while its body arrives (a "request failed" traceback
    and a 500 before) or while a GET is answered (socketserver's traceback); a request line with
    a terminal's escape sequence (written to the log as sent: it cleared the screen)."""
    url = urlsplit(server[0])
    linger = struct.pack("ii", 1, 0)  # close() sends a reset
    for head in [b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100000\r\n\r\n{"] + [
        b"GET /v1/models HTTP/1.1\r\n\r\n"
    ] * 20:
        with socket.create_connection((url.hostname, url.port), timeout=30) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            s.sendall(head)
            time.sleep(0.05)
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(b"GET /\x1b[2J\x1b]0;title\x07 HTTP/1.1\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 404")
    ok = {"model": str(served_folder), "messages": HI, "max_tokens": 1}
    assert request(server[0], "POST", "/v1/chat/completions", json.dumps(ok).encode())[0] == 200
    log = server[1].read_text()
    assert "Traceback" not in log and "request failed" not in log, log[-3000:]
    assert "\x1b" not in log and "GET /\\x1b[2J\\x1b]0;title\\x07 HTTP/1.1" in log, log[-500:]


def test_the_server_logged_no_traceback(server, client, served_folder):
    """Runs after the bad inputs above: none of them reached a traceback, the server serves on."""
    after = client.chat.completions.create(model=str(served_folder), messages=HELLO, max_tokens=2)
    assert after.usage.completion_tokens == 2
    assert "Traceback" not in server[1].read_text()
