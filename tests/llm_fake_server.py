"""A small OpenAI-compatible chat server for tests: scripted replies on 127.0.0.1 (port 0).

Serves ``POST /v1/chat/completions`` as JSON, or as server-sent events when the request asks for
``stream``. Each request takes the next item of the script:

- ``{"content": "text"}``: an assistant message
- ``{"tool_args": {...} or "raw string"}``: a tool call of the tool the request names (what
  ``with_structured_output(method="function_calling")`` asks for)
- ``{"status": 500, "message": "..."}``: an HTTP error with an OpenAI-style error body
- ``"delay_s"`` in any item: sleep first (timeouts)
- ``"usage": [prompt, completion]`` in any item: the token counts to report; by default
  prompt = characters of the request's messages / 4, completion = characters of the reply / 4
- ``"no_usage": true``: report no usage at all

When the script is exhausted the server answers 400 "script exhausted", so a test that makes
more calls than it planned fails loudly. The script may instead be a function of the request body
returning an item (replies chosen by role, e.g. for scripts/gpu_llm_smoke.py). ``requests`` holds
every request body received.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeOpenAI:
    def __init__(self, script=None, model: str = "fake-model"):
        self.script = script if callable(script) else list(script or [])
        self.model = model
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self, port: int = 0) -> "FakeOpenAI":
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):  # noqa: N802
                if self.path.rstrip("/").endswith("/models"):
                    self._json(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    self._json(404, {"error": {"message": f"no route {self.path}"}})
                    return
                with server._lock:
                    server.requests.append(body)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    if callable(server.script):
                        item = server.script(body)
                    else:
                        item = server.script.pop(0) if server.script else None
                if item is None:
                    self._json(400, {"error": {"message": "script exhausted", "type": "invalid_request_error"}})
                    return
                if item.get("delay_s"):
                    time.sleep(item["delay_s"])
                if "status" in item:
                    self._json(item["status"], {"error": {"message": item.get("message", "scripted error"),
                                                          "type": "server_error"}})
                    return
                server._answer(self, body, item)

            def _json(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def port(self) -> int:
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ---------------------------------------------------------------- replies
    @staticmethod
    def _tool_name(body: dict) -> str:
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            return choice.get("function", {}).get("name", "tool")
        tools = body.get("tools") or []
        return tools[0]["function"]["name"] if tools else "tool"

    def _answer(self, handler, body: dict, item: dict) -> None:
        content = item.get("content")
        tool_call = None
        if "tool_args" in item:
            args = item["tool_args"]
            tool_call = {"id": f"call_{len(self.requests)}", "type": "function",
                         "function": {"name": self._tool_name(body),
                                      "arguments": args if isinstance(args, str) else json.dumps(args)}}
        reply_chars = len(content or "") + len(tool_call["function"]["arguments"] if tool_call else "")
        prompt_chars = len(json.dumps(body.get("messages", [])))
        p, c = item.get("usage") or (max(1, prompt_chars // 4), max(1, reply_chars // 4))
        usage = None if item.get("no_usage") else {
            "prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
        cid = f"chatcmpl-{len(self.requests)}"
        finish = "tool_calls" if tool_call else "stop"
        if not body.get("stream"):
            msg = {"role": "assistant", "content": content}
            if tool_call:
                msg["tool_calls"] = [tool_call]
            obj = {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": self.model,
                   "choices": [{"index": 0, "message": msg, "finish_reason": finish}]}
            if usage:
                obj["usage"] = usage
            handler._json(200, obj)
            return
        # server-sent events
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()

        def send(delta: dict | None, finish_reason=None, use=None):
            chunk = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                     "model": self.model,
                     "choices": [] if delta is None else [{"index": 0, "delta": delta,
                                                           "finish_reason": finish_reason}]}
            if use is not None:
                chunk["usage"] = use
            handler.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            handler.wfile.flush()

        send({"role": "assistant", "content": ""})
        if content:
            step = max(1, len(content) // 4)
            for i in range(0, len(content), step):
                send({"content": content[i:i + step]})
        if tool_call:
            args = tool_call["function"]["arguments"]
            send({"tool_calls": [{"index": 0, "id": tool_call["id"], "type": "function",
                                  "function": {"name": tool_call["function"]["name"], "arguments": ""}}]})
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                send({"tool_calls": [{"index": 0, "function": {"arguments": part}}]})
        send({}, finish_reason=finish)
        if usage and (body.get("stream_options") or {}).get("include_usage"):
            send(None, use=usage)
        handler.wfile.write(b"data: [DONE]\n\n")
        handler.wfile.flush()
        handler.close_connection = True
