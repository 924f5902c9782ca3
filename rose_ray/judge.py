"""DiscoveryWorld's explanatory-knowledge score: a language model judges, one critical question
at a time, whether the agent's report (what it says it discovered, asked when the episode
ended) answers the question. Knowledge = the fraction of a game's critical questions judged 1.

The judge is any model `eval` takes: a local folder (an engine actor; the prompt is built with
its tokenizer's chat template) or `openai:URL` (chat completions, so the server applies its own
template; vLLM, `rose-ray serve`, or OpenAI's API). Greedy. Each answer is parsed for a 0/1
verdict and a short reason; an answer without a readable verdict counts 0 and is counted as
unparsed, a request the server refuses counts 0 and is counted as an error. Verdicts are cached
in a JSONL file keyed by a hash of (question, knowledge) and the judge's name, so a resumed or
repeated eval does not ask twice.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rose_ray.envs.protocol import strip_thinking
from rose_ray.types import SamplingParams

MAX_REPORT_CHARS = 6000  # a report longer than this is cut: the judge's context is finite

JUDGE_PROMPT = """You are checking what an agent found out while playing a scientific discovery game.

The agent's task was:
{task}

When the game ended, the agent reported what it had discovered:
<report>
{knowledge}
</report>

Question about the report: {question}

Judge only what the report itself says, not what the agent may have done. Answer 1 if the report \
clearly and correctly states what the question asks about, and 0 if it does not (missing, wrong, \
or too vague to count). Reply with exactly two lines:
Reason: <one short sentence>
Verdict: <1 or 0>"""


def judge_messages(task: str, knowledge: str, question: str) -> list[dict[str, str]]:
    """The judge's one user message for one critical question."""
    if len(knowledge) > MAX_REPORT_CHARS:
        knowledge = knowledge[:MAX_REPORT_CHARS] + " [...]"
    return [{"role": "user", "content": JUDGE_PROMPT.format(task=task.strip() or "(not given)",
                                                            knowledge=knowledge, question=question.strip())}]


PROMPT_HASH = hashlib.sha256(JUDGE_PROMPT.encode()).hexdigest()[:8]  # in the cache's judge name


# --------------------------------------------------------------------------- parsing
@dataclass
class Verdict:
    """One critical question's verdict. `parsed`: the answer held a readable verdict (else the
    verdict is 0 and the answer counts as unparsed); `error`: the judge could not answer."""

    question: str
    verdict: int
    parsed: bool
    reason: str = ""
    error: str = ""
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "cached"}


_LABEL = r"(?:verdict|score|answer|judg(?:e)?ment|grade|rating)"
_VALUE = r"(?P<v>[01](?!\d|\.\d)|yes|no|true|false|correct|incorrect)\b"
_LABELLED = re.compile(_LABEL + r"[\s*_`'\"]*(?:is|[:=\-])?[\s*_`'\"]*" + _VALUE, re.IGNORECASE)
# A `Verdict:` label at a line's start (what the prompt asks for) wins over any other label:
# a reason may say "the correct answer is 1 part A" after it.
_VERDICT_LINE = re.compile(r"^[\s*_`#>\-]*verdict[\s*_`'\"]*(?:is|[:=\-])?[\s*_`'\"]*" + _VALUE,
                           re.IGNORECASE | re.MULTILINE)
_REASON = re.compile(r"(?:reason|explanation|because)[\s*_`]*[:\-]?[\s*_`]*(?P<r>.+?)(?=\n[\s*_`]*" + _LABEL
                     + r"\b|\Z)", re.IGNORECASE | re.DOTALL)
_WORDS = {"1": 1, "0": 0, "yes": 1, "no": 0, "true": 1, "false": 0, "correct": 1, "incorrect": 0}


def parse_verdict(text: str, question: str = "") -> Verdict:
    """A judge's answer as a Verdict. Read, in order: a JSON object with a verdict/score/answer
    key; the last labelled verdict (`Verdict: 1`, `**Verdict**: no`, `score = 0`); an answer
    that is only `0` or `1`. Anything else is unparsed (verdict 0)."""
    text = strip_thinking(str(text or "")).strip()
    verdict: int | None = None
    reason = ""
    for m in re.finditer(r"\{[^{}]*\}", text):  # a JSON answer, e.g. {"verdict": 1, "reason": "..."}
        try:
            obj = json.loads(m.group())
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        low = {str(k).lower(): v for k, v in obj.items()}
        value = next((low[k] for k in ("verdict", "score", "answer", "judgement", "judgment") if k in low), None)
        word = str(value).strip().lower() if isinstance(value, (int, str, bool)) else ""
        if isinstance(value, bool):
            word = "true" if value else "false"
        if word in _WORDS:
            verdict = _WORDS[word]
            reason = str(low.get("reason") or low.get("explanation") or "")
    json_answer = verdict is not None
    if verdict is None:
        labelled = list(_VERDICT_LINE.finditer(text)) or list(_LABELLED.finditer(text))
        if labelled:
            verdict = _WORDS[labelled[-1].group("v").lower()]
        elif text in ("0", "1"):
            verdict = int(text)
    if not reason and not json_answer:
        m = _REASON.search(text)  # the labelled reason, else the whole answer (it is short)
        reason = m.group("r") if m else ("" if text in ("0", "1") else text)
    reason = " ".join(reason.split())[:500]
    if verdict is None:
        return Verdict(question, 0, False, reason)
    return Verdict(question, verdict, True, reason)


# --------------------------------------------------------------------------- cache
def verdict_key(question: str, knowledge: str) -> str:
    return hashlib.sha256(f"{question}\x00{knowledge}".encode()).hexdigest()


class VerdictCache:
    """Verdicts by (judge, hash of question and knowledge), appended to a JSONL file as they
    come. Unreadable lines (a write cut short by a kill) are skipped: a miss asks again."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.entries: dict[tuple[str, str], dict[str, Any]] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    row = json.loads(line)
                    self.entries[(row["judge"], row["key"])] = row
                except (ValueError, KeyError, TypeError):
                    continue

    def get(self, judge: str, question: str, knowledge: str) -> Verdict | None:
        row = self.entries.get((judge, verdict_key(question, knowledge)))
        if row is None:
            return None
        return Verdict(question, int(row["verdict"]), bool(row["parsed"]), str(row.get("reason", "")), cached=True)

    def put(self, judge: str, knowledge: str, verdict: Verdict, raw: str) -> None:
        row = {"judge": judge, "key": verdict_key(verdict.question, knowledge), "question": verdict.question,
               "verdict": verdict.verdict, "parsed": verdict.parsed, "reason": verdict.reason, "raw": raw[:2000]}
        self.entries[(judge, row["key"])] = row
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


# --------------------------------------------------------------------------- judges
@dataclass
class JudgeConfig:
    model: str  # a local folder, or openai:URL
    served_model: str = ""  # the name an openai: server expects (default: its own default)
    max_new_tokens: int = 512
    thinking: bool | None = None  # the chat template's enable_thinking (None: off locally, unsent to a server)
    concurrency: int = 8
    # A local judge's prompt + answer: the task (~0.5k tokens), a report cut at MAX_REPORT_CHARS
    # (~1.5k) and the question fit, and every current model has this many positions.
    context_tokens: int = 4096
    dtype: str = "auto"

    @property
    def served(self) -> bool:
        return self.model.startswith("openai:")

    @property
    def name(self) -> str:
        """The judge's name in results."""
        return f"{self.model}@{self.served_model}" if self.served_model else self.model

    @property
    def cache_name(self) -> str:
        """The cache's name: the judge and what changes its greedy answers (the prompt, thinking,
        the token budget: an answer cut short may be whole with a larger one)."""
        return f"{self.name}|thinking={self.thinking}|max_new_tokens={self.max_new_tokens}|prompt={PROMPT_HASH}"

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens)


class JudgeUnavailable(ValueError):
    """The judge cannot be reached or loaded (a clear error, before or while judging)."""


def _base_url(cfg: JudgeConfig) -> str:
    base_url = cfg.model[len("openai:"):].rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise JudgeUnavailable(f"--judge {cfg.model}: expected openai:http://HOST:PORT/v1")
    return base_url


def _served_engine(cfg: JudgeConfig, timeout_s: float = 300.0, **retry: float) -> Any:
    """The client of a served judge (`retry`: the engine's retry_s, when not its default)."""
    from rose_ray.inference.engine import EngineConfig
    from rose_ray.inference.openai import OpenAIEngine

    return OpenAIEngine(EngineConfig(backend="openai", base_url=_base_url(cfg), model=cfg.served_model,
                                     context_tokens=cfg.context_tokens, max_batch_size=cfg.concurrency,
                                     timeout_s=timeout_s, **retry))


def check_judge(cfg: JudgeConfig) -> JudgeConfig:
    """Fail before any game is played when the judge is not there: a folder without a
    tokenizer, a server that does not answer, or one that does not serve `served_model`.
    Returns the config to judge with (a local model's context capped at its positions)."""
    if cfg.served:
        from rose_ray.inference.openai import OpenAIServerError

        # Asked once (retry_s 0): a judge that is not there now is an error now, not after a
        # minute of backoff.
        engine = _served_engine(cfg, timeout_s=30.0, retry_s=0.0)
        try:
            models = engine.models()
        except OpenAIServerError as e:  # no answer (the message says "cannot reach"), or refused
            hint = " (set ROSE_RAY_API_KEY)" if e.status in (401, 403) else ""
            raise JudgeUnavailable(f"--judge {cfg.model}: {e}{hint}") from None
        except (ValueError, KeyError, TypeError) as e:
            raise JudgeUnavailable(f"--judge {cfg.model}: {engine.base_url}/models is not an OpenAI-compatible "
                                   f"model list ({e})") from None
        finally:
            engine.close()
        if cfg.served_model and cfg.served_model not in models:
            raise JudgeUnavailable(f"--judge-model {cfg.served_model!r}: the server at {cfg.model} serves {models}")
        return cfg
    from rose_ray.models import ModelNotAvailable, load_tokenizer

    if not Path(cfg.model).is_dir():
        raise JudgeUnavailable(f"--judge {cfg.model}: no such model folder (or use openai:URL)")
    try:
        load_tokenizer(cfg.model)
        from transformers import AutoConfig

        limit = getattr(AutoConfig.from_pretrained(cfg.model), "max_position_embeddings", None)
    except (ModelNotAvailable, OSError, ValueError) as e:
        raise JudgeUnavailable(f"--judge {cfg.model}: {e}") from None
    return replace(cfg, context_tokens=min(cfg.context_tokens, limit or cfg.context_tokens))


class Judge:
    """Asks one judge model; `answer` returns (text, error)."""

    def __init__(self, cfg: JudgeConfig) -> None:
        self.cfg = cfg
        self.engine: Any = None
        self.chat: Any = None
        self._agent: Any = None
        if cfg.served:
            self.engine = _served_engine(cfg)
        else:
            from rose_ray.inference.engine import EngineConfig
            from rose_ray.rollout.actors import start_agents

            self._agent, _ = start_agents(EngineConfig(model=cfg.model, dtype=cfg.dtype, context_tokens=cfg.context_tokens,
                                                       max_batch_size=cfg.concurrency), None,
                                          enable_thinking=bool(cfg.thinking))
            self.engine, self.chat = self._agent.engine, self._agent.chat

    async def answer(self, messages: list[dict[str, str]], request_id: str) -> tuple[str, str]:
        """(the judge's text, "") or ("", why it could not answer). A server that cannot be
        reached at all raises JudgeUnavailable: every other question would fail the same way."""
        from rose_ray.inference.engine import GenerationRequest
        from rose_ray.inference.openai import OpenAIServerError, OpenAIServerGone

        if self.cfg.served:
            try:
                text, _ = await asyncio.to_thread(self.engine.chat, messages, self.cfg.sampling(), self.cfg.thinking)
            except OpenAIServerGone as e:
                raise JudgeUnavailable(f"judge {self.cfg.model}: {e}") from None
            except OpenAIServerError as e:  # a refused request, or an answer without a message
                return "", f"the judge server did not answer this question: {e}"
        else:
            ids = self.chat.render_ids(messages, add_generation_prompt=True)
            result = await self.engine.generate.remote(
                GenerationRequest(prompt_ids=ids, sampling=self.cfg.sampling(), request_id=request_id))
            if result.finish_reason == "context":
                return "", f"the prompt ({len(ids)} tokens) does not fit the judge's context"
            text = result.text
        return text, ""

    def close(self) -> None:
        if self.cfg.served:
            self.engine.close()
        else:
            from rose_ray.rollout.actors import stop_agents

            stop_agents(self._agent)


# --------------------------------------------------------------------------- scoring
def judge_records(records: list[dict[str, Any]], cfg: JudgeConfig, cache: VerdictCache) -> dict[str, int]:
    """Judge every critical question of every record that has some; sets each such record's
    `verdicts`, `knowledge` and `judge`. The judge is started only when the cache lacks an
    answer. Returns counts: questions, asked, cached, unparsed, errors."""
    jobs: list[tuple[dict[str, Any], str, str]] = []
    for r in records:
        for q in r.get("critical_questions") or []:
            jobs.append((r, q, (r.get("report") or "").strip()))
    verdicts: dict[tuple[str, str], Verdict] = {}
    todo: dict[tuple[str, str], str] = {}  # (question, knowledge) -> the task description
    for r, q, knowledge in jobs:
        key = (q, knowledge)
        if key in verdicts or key in todo:
            continue
        hit = cache.get(cfg.cache_name, q, knowledge)
        if hit is not None:
            verdicts[key] = hit
        elif not knowledge:  # nothing reported: nothing to judge
            verdicts[key] = Verdict(q, 0, True, "the agent reported nothing")
        else:
            todo[key] = str(r.get("task_description") or "")
    if todo:
        judge = Judge(cfg)
        try:
            verdicts.update(asyncio.run(_ask_all(judge, todo, cache)))
        finally:
            judge.close()
    counts = {"questions": len(jobs), "asked": len(todo), "cached": 0, "unparsed": 0, "errors": 0}
    for r in records:
        qs = r.get("critical_questions") or []
        if not qs:
            continue
        knowledge = (r.get("report") or "").strip()
        got = [verdicts[(q, knowledge)] for q in qs]
        r["verdicts"] = [v.to_dict() for v in got]
        r["knowledge"] = sum(v.verdict for v in got) / len(got)
        r["judge"] = cfg.name
        counts["cached"] += sum(v.cached for v in got)
        counted = verdict_counts(r["verdicts"])
        counts["unparsed"] += counted["unparsed"]
        counts["errors"] += counted["errors"]
    return counts


def verdict_counts(verdicts: list[dict[str, Any]]) -> dict[str, int]:
    """Of some verdicts (as recorded): how many had no readable verdict, how many no answer."""
    return {"unparsed": sum(not v["parsed"] and not v.get("error") for v in verdicts),
            "errors": sum(bool(v.get("error")) for v in verdicts)}


async def _ask_all(judge: Judge, todo: dict[tuple[str, str], str],
                   cache: VerdictCache) -> dict[tuple[str, str], Verdict]:
    limit = asyncio.Semaphore(judge.cfg.concurrency)

    async def one(n: int, key: tuple[str, str]) -> tuple[tuple[str, str], Verdict]:
        question, knowledge = key
        task = todo[key]
        async with limit:
            text, error = await judge.answer(judge_messages(task, knowledge, question), f"judge/{n}")
        if error:  # not cached: a later run asks again
            return key, Verdict(question, 0, False, "", error)
        verdict = parse_verdict(text, question)
        cache.put(judge.cfg.cache_name, knowledge, verdict, text)
        return key, verdict

    return dict(await asyncio.gather(*(one(n, k) for n, k in enumerate(todo))))
