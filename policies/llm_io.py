"""The LLM policy's client: one chat exchange at a time through langchain-openai, with token
accounting, a token budget, a record of every exchange in the run folder, offline replay of a
recorded run, and transport errors turned into one clear ``LLMError``.

Every exchange is written to ``<run dir>/llm/<n>_<role>.json`` (prompt messages, reply, parsed
structure or parse error, usage). ``n`` counts the exchanges of the run so far, read from the
state's ``llm_usage`` (the calls committed in checkpoints), so a resumed step re-writes the same
file and a replay of the run serves reply ``n`` to request ``n``. A file that would be replaced
(a time-travel branch re-asking the same question) is moved to ``llm/superseded/`` first.

With ``settings.llm_replay_dir`` set, replies come from the recorded exchanges of that run, in
order, and no network is used: the same parsers read them as if the model had sent them.

The API key is read from the environment variable named by ``settings.llm_api_key_env`` when a
model is built; it is never stored in the state, the settings, the records or the logs.
"""
from __future__ import annotations

import json
import os
import pathlib
import time
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from state import EggState, LLMUsage, Settings, run_folder

#: exit code of ``egg run`` when the model cannot be reached or keeps answering with errors
EXIT_LLM = 3


class LLMError(RuntimeError):
    """The model could not be reached, or answered with an error, after the retries.

    Ends the run with one line (CLI exit code 3); the run folder and its checkpoints stay as
    they were, so ``egg run --resume RUN`` continues from the last checkpoint."""


class BudgetExhausted(Exception):
    """The run's token budget is spent: the role declines with this message."""


@dataclass
class Reply:
    """One answered exchange."""

    index: int
    text: str  # the reply's text content (or the tool call's arguments for structured calls)
    parsed: BaseModel | None = None
    error: str | None = None  # why the reply could not be parsed into the schema
    prompt_tokens: int = 0
    completion_tokens: int = 0


# ------------------------------------------------------------------------------ folders
def exchanges_dir(settings: Settings, state: EggState) -> pathlib.Path:
    """``<run folder>/llm`` (state.run_folder)."""
    return run_folder(settings, state) / "llm"


def replay_source(path: str | os.PathLike) -> pathlib.Path:
    """The folder of recorded exchanges: a run folder or its llm/ folder."""
    p = pathlib.Path(path)
    if (p / "llm").is_dir():
        p = p / "llm"
    return p


def load_exchanges(folder: str | os.PathLike) -> list[dict]:
    """Recorded exchanges of a run, by index (superseded ones left out)."""
    d = replay_source(folder)
    if not d.is_dir():
        raise LLMError(f"replay: no recorded exchanges in {folder} (expected a run folder with llm/)")
    recs = []
    for f in d.glob("*.json"):
        try:
            recs.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise LLMError(f"replay: {f} is unreadable ({e})") from None
    recs.sort(key=lambda r: r.get("index", 0))
    return recs


# ------------------------------------------------------------------------------ accounting
def usage_of(message: Any) -> tuple[int, int] | None:
    """(prompt, completion) tokens a reply reports: usage_metadata, else token_usage."""
    um = getattr(message, "usage_metadata", None)
    if um:
        return int(um.get("input_tokens") or 0), int(um.get("output_tokens") or 0)
    tu = (getattr(message, "response_metadata", None) or {}).get("token_usage") or {}
    if tu:
        return int(tu.get("prompt_tokens") or 0), int(tu.get("completion_tokens") or 0)
    return None


def estimate_tokens(text: str) -> int:
    """Tokens estimated as characters / 4 (no tokenizer download)."""
    return (len(text) + 3) // 4


#: the key of state.llm_usage that holds the whole run's usage (the other keys are roles)
TOTAL = "total"


def total_tokens(usage: dict[str, LLMUsage]) -> int:
    return sum(u.prompt_tokens + u.completion_tokens for k, u in usage.items() if k != TOTAL)


def _add(a: LLMUsage | None, b: LLMUsage) -> LLMUsage:
    a = a or LLMUsage()
    return LLMUsage(calls=a.calls + b.calls, prompt_tokens=a.prompt_tokens + b.prompt_tokens,
                    completion_tokens=a.completion_tokens + b.completion_tokens,
                    cost_usd=round(a.cost_usd + b.cost_usd, 6))


# ------------------------------------------------------------------------------ models
def chat_model(settings: Settings):
    """A ``ChatOpenAI`` for the settings; the key comes from the named environment variable."""
    from langchain_openai import ChatOpenAI

    key = os.environ.get(settings.llm_api_key_env or "", "")
    if not key:
        if not settings.llm_base_url:
            raise LLMError(f"no API key: set the environment variable {settings.llm_api_key_env} "
                           "(or point --base-url at an OpenAI-compatible server)")
        key = "not-needed"  # local servers (vLLM, SGLang, Ollama) usually accept any key
    return ChatOpenAI(
        model=settings.llm_model, base_url=settings.llm_base_url or None, api_key=key,
        temperature=settings.llm_temperature, max_tokens=settings.llm_max_tokens,
        timeout=settings.llm_timeout_s, max_retries=settings.llm_retries,
        streaming=settings.llm_streaming, stream_usage=True)


def _replay_model(record: dict):
    """A ChatOpenAI whose only answer is a recorded reply (no network)."""
    from langchain_core.messages import messages_from_dict
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_openai import ChatOpenAI

    class ReplayChatOpenAI(ChatOpenAI):
        recorded: dict = {}

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            rep = self.recorded.get("reply")
            if rep is None:  # the live call failed while parsing (json_schema): fail the same way
                raise ValueError(self.recorded.get("parse_error") or "recorded reply missing")
            return ChatResult(generations=[ChatGeneration(message=messages_from_dict([rep])[0])])

    return ReplayChatOpenAI(model=record.get("model") or "replay", api_key="replay",
                            base_url="http://127.0.0.1:9/v1", max_retries=0, recorded=record)


def _describe_error(e: Exception, settings: Settings) -> str:
    import openai

    where = settings.llm_base_url or "the OpenAI API"
    tries = f"{settings.llm_retries + 1} attempt(s)"
    if isinstance(e, openai.APITimeoutError):
        return f"LLM endpoint {where} timed out ({settings.llm_timeout_s:g} s per request, {tries})"
    if isinstance(e, openai.APIConnectionError):
        root, seen = e, set()
        while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
            seen.add(id(nxt))
            root = nxt  # the innermost cause: the socket's own words
        why = str(root).strip().splitlines()[0][:160] if str(root).strip() else type(root).__name__
        return f"cannot reach the LLM endpoint {where} after {tries}: {why}"
    if isinstance(e, openai.RateLimitError):
        return f"LLM endpoint {where} is rate limiting (HTTP 429) after {tries}: {e.message[:200]}"
    if isinstance(e, openai.AuthenticationError):
        return (f"LLM endpoint {where} refused the API key (HTTP 401) from "
                f"${settings.llm_api_key_env}: {e.message[:200]}")
    if isinstance(e, openai.NotFoundError):
        return f"LLM endpoint {where}: model {settings.llm_model!r} or route not found (HTTP 404): {e.message[:200]}"
    if isinstance(e, openai.APIStatusError):
        return f"LLM endpoint {where} answered HTTP {e.status_code} after {tries}: {e.message[:200]}"
    return f"LLM request to {where} failed: {type(e).__name__}: {str(e)[:200]}"


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump()
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


# ------------------------------------------------------------------------------ the client
class LLMClient:
    """Exchanges of one node step. Usage is kept per role on top of the state's totals."""

    def __init__(self, settings: Settings, state: EggState):
        self.settings = settings
        self.state_usage = {k: v.model_copy() for k, v in state.llm_usage.items() if k != TOTAL}
        self.start_index = sum(u.calls for u in self.state_usage.values())
        self.calls = 0
        self.delta: dict[str, LLMUsage] = {}
        self.dir = exchanges_dir(settings, state)
        self._replay: list[dict] | None = None
        if settings.llm_replay_dir:
            self._replay = load_exchanges(settings.llm_replay_dir)
        self._model = None

    # -- accounting
    def usage(self) -> dict[str, LLMUsage]:
        """Run totals (state + this step) of the roles this step used, and of the run
        (key ``total``); empty when this step made no call."""
        if not self.delta:
            return {}
        out = {role: _add(self.state_usage.get(role), d) for role, d in self.delta.items()}
        run = LLMUsage()
        for u in [*self.state_usage.values(), *self.delta.values()]:
            run = _add(run, u)
        out[TOTAL] = run
        return out

    def tokens_used(self) -> int:
        return total_tokens(self.state_usage) + total_tokens(self.delta)

    def check_budget(self, prompt_chars: int = 0) -> None:
        budget = self.settings.llm_token_budget
        if budget <= 0:
            return
        used = self.tokens_used()
        if used >= budget or used + prompt_chars // 4 > budget:
            raise BudgetExhausted(f"LLM token budget exhausted: {used} of {budget} tokens used "
                                  f"(the next prompt needs ~{prompt_chars // 4}); raise --token-budget "
                                  "or EGG_LLM_TOKEN_BUDGET to go on")

    def _account(self, role: str, p: int, c: int) -> None:
        u = self.delta.setdefault(role, LLMUsage())
        u.calls += 1
        u.prompt_tokens += p
        u.completion_tokens += c
        s = self.settings
        u.cost_usd += p / 1000 * s.llm_price_per_1k_prompt + c / 1000 * s.llm_price_per_1k_completion

    # -- one exchange
    def ask(self, role: str, messages: list, schema: type[BaseModel] | None = None) -> Reply:
        """Send ``messages``; with ``schema``, through ``with_structured_output(schema)``.

        Raises BudgetExhausted before a call the budget cannot pay for, LLMError when the
        endpoint fails after the client's retries. A reply that does not fit the schema is
        returned with ``error`` set (the caller feeds the error back)."""
        import openai

        prompt_chars = sum(len(str(m.content)) for m in messages)
        self.check_budget(prompt_chars)
        index = self.start_index + self.calls
        record = None
        if self._replay is not None:
            if index >= len(self._replay):
                raise LLMError(f"replay: the recorded run has {len(self._replay)} exchange(s); "
                               f"exchange {index} ({role}) was not recorded")
            record = self._replay[index]
            if record.get("role") != role or record.get("schema") != (schema.__name__ if schema else None):
                raise LLMError(f"replay diverged at exchange {index}: recorded {record.get('role')} "
                               f"({record.get('schema') or 'text'}), asked {role} "
                               f"({schema.__name__ if schema else 'text'})")
            model = _replay_model(record)
        else:
            if self._model is None:
                self._model = chat_model(self.settings)
            model = self._model
        runnable = model
        if schema is not None:
            runnable = model.with_structured_output(
                schema, method=self.settings.llm_structured_method, include_raw=True)
        t0 = time.time()
        raw = parsed = None
        error = None
        try:
            out = runnable.invoke(messages)
        except openai.APIError as e:  # transport and HTTP errors, after the client's retries
            raise LLMError(_describe_error(e, self.settings)) from None
        except (ValueError, openai.OpenAIError) as e:  # json_schema: the reply failed to parse
            error = f"the reply is not valid {schema.__name__ if schema else 'output'}: {str(e)[:600]}"
            out = None
        if schema is None:
            raw = out
        elif out is not None:
            raw, parsed = out.get("raw"), out.get("parsed")
            if parsed is None:
                error = self._parse_error(out, schema)
        self.calls += 1
        text = self._text(raw)
        usage = usage_of(raw) if raw is not None else None
        estimated = usage is None
        p, c = usage if usage is not None else (prompt_chars // 4, len(text) // 4)
        self._account(role, p, c)
        self._record(index, role, messages, raw, parsed, error, schema, p, c, estimated,
                     time.time() - t0, record)
        return Reply(index=index, text=text, parsed=parsed, error=error, prompt_tokens=p,
                     completion_tokens=c)

    @staticmethod
    def _text(raw: Any) -> str:
        if raw is None:
            return ""
        content = raw.content if isinstance(raw.content, str) else "".join(
            b.get("text", "") if isinstance(b, dict) else str(b) for b in raw.content)
        calls = [json.dumps(tc.get("args")) for tc in (getattr(raw, "tool_calls", None) or [])]
        calls += [str(tc.get("args")) for tc in (getattr(raw, "invalid_tool_calls", None) or [])]
        return content if not calls else (content + "\n" if content else "") + "\n".join(calls)

    @staticmethod
    def _parse_error(out: dict, schema: type[BaseModel]) -> str:
        err = out.get("parsing_error")
        raw = out.get("raw")
        if err is not None:
            return f"the reply does not fit {schema.__name__}: {str(err)[:800]}"
        bad = getattr(raw, "invalid_tool_calls", None) or []
        if bad:
            return f"the tool call's arguments are not valid JSON: {str(bad[0].get('error'))[:400]}"
        return f"the reply has no {schema.__name__} (answer by calling the {schema.__name__} tool)"

    def _record(self, index, role, messages, raw, parsed, error, schema, p, c, estimated, wall,
                replayed) -> None:
        from langchain_core.messages import messages_to_dict

        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{index:03d}_{role}.json"
        for old in self.dir.glob(f"{index:03d}_*.json"):
            sup = self.dir / "superseded"
            sup.mkdir(exist_ok=True)
            old.rename(sup / f"{old.stem}.{int(time.time() * 1000)}.json")
        rec = {
            "index": index, "role": role, "schema": schema.__name__ if schema else None,
            "model": self.settings.llm_model if replayed is None else replayed.get("model"),
            "base_url": self.settings.llm_base_url if replayed is None else replayed.get("base_url"),
            "method": self.settings.llm_structured_method if schema else None,
            "replayed_from": str(replay_source(self.settings.llm_replay_dir)) if replayed else None,
            "messages": _jsonable(messages_to_dict(messages)),
            "reply": _jsonable(messages_to_dict([raw])[0]) if raw is not None else None,
            "parsed": _jsonable(parsed) if parsed is not None else None,
            "parse_error": error,
            "usage": {"prompt_tokens": p, "completion_tokens": c, "estimated": estimated},
            "wall_s": round(wall, 3),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        path.write_text(json.dumps(rec, indent=1))
