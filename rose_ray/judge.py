"""Explanatory knowledge, judged by a language model (docs/games.md, "Knowledge"): each critical
question's verdict, 1 or 0, is a judge's greedy answer about the agent's thoughts or report, asked
and read as the world's scorer says (`World.knowledge`); verdicts are cached in a JSONL file.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rose_ray.envs.worlds import knowledge_scorer
from rose_ray.errors import InputError
from rose_ray.types import SamplingParams

KNOWLEDGE_SOURCES = ("thoughts", "report")
CHARS_PER_TOKEN = 3  # a low estimate, so that a knowledge cut to the judge's context fits it
PROMPT_TOKENS = 1024  # the judge's prompt without the knowledge: task description, question, rules


def fit_knowledge(knowledge: str, max_chars: int) -> tuple[str, bool]:
    """(the knowledge, whether it was cut): past `max_chars` the oldest part goes."""
    if len(knowledge) <= max_chars:
        return knowledge, False
    kept = knowledge[len(knowledge) - max_chars:]
    return f"[... {len(knowledge) - len(kept)} earlier characters cut to fit the judge ...]\n{kept}", True


@dataclass
class Verdict:
    """One critical question's verdict. `parsed`: the answer held a readable one (else 0);
    `error`: the judge could not answer."""

    question: str
    verdict: int
    parsed: bool
    explanation: str = ""
    error: str = ""
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "cached"}


# --------------------------------------------------------------------------- cache
def verdict_key(question: str, knowledge: str) -> str:
    return hashlib.sha256(f"{question}\x00{knowledge}".encode()).hexdigest()


class VerdictCache:
    """Verdicts by (judge, hash of question and knowledge), appended to a JSONL file as they
    come. An unreadable line is named and skipped: a miss asks again."""

    def __init__(self, path: str | Path) -> None:
        from rose_ray.files import drop_cut_line, json_records

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.entries: dict[tuple[str, str], dict[str, Any]] = {}

        def bad(n: int, problem: str) -> None:
            print(f"judge: {problem}; skipped (that verdict is asked again)", file=sys.stderr, flush=True)

        if self.path.exists():
            for n, _, row in json_records(self.path, bad):
                kinds = {"judge": str, "key": str, "verdict": int, "parsed": bool}
                if not all(isinstance(row.get(k), kind) for k, kind in kinds.items()):
                    bad(n, f"{self.path}:{n}: not a verdict (judge, key, verdict, parsed)")
                    continue
                self.entries[(row["judge"], row["key"])] = row
            drop_cut_line(self.path)  # what is appended starts on a line of its own

    def get(self, judge: str, question: str, knowledge: str) -> Verdict | None:
        row = self.entries.get((judge, verdict_key(question, knowledge)))
        return None if row is None else Verdict(question, int(row["verdict"]), bool(row["parsed"]),
                                                str(row.get("explanation", "")), cached=True)

    def put(self, judge: str, knowledge: str, verdict: Verdict, raw: str) -> None:
        row = {"judge": judge, "key": verdict_key(verdict.question, knowledge), "question": verdict.question,
               "verdict": verdict.verdict, "parsed": verdict.parsed, "explanation": verdict.explanation,
               "raw": raw[:2000]}
        self.entries[(judge, row["key"])] = row
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


# --------------------------------------------------------------------------- judges
@dataclass
class JudgeConfig:
    model: str  # a local folder, or openai:URL
    world: str | None = None  # whose knowledge scorer asks and reads (World.knowledge)
    served_model: str = ""  # the name an openai: server expects (default: its own default)
    max_new_tokens: int = 800  # the paper's scorer's budget
    thinking: bool | None = None  # the chat template's enable_thinking (None: off locally, unsent to a server)
    concurrency: int = 8
    # Prompt + answer, the knowledge cut to fit (Qwen3-32B's; a local folder's positions at most).
    context_tokens: int = 32768
    dtype: str = "auto"

    @property
    def served(self) -> bool:
        return self.model.startswith("openai:")

    @property
    def name(self) -> str:
        return f"{self.model}@{self.served_model}" if self.served_model else self.model

    @property
    def cache_name(self) -> str:
        """The cache's name: the judge and what changes its greedy answers."""
        return (f"{self.name}|thinking={self.thinking}|max_new_tokens={self.max_new_tokens}"
                f"|prompt={self.scorer.PROMPT_HASH}")

    @property
    def scorer(self) -> Any:
        """The world's knowledge scorer: `judge_messages`, `read_verdict`, `PROMPT_HASH`."""
        return knowledge_scorer(self.world)

    @property
    def knowledge_chars(self) -> int:
        return CHARS_PER_TOKEN * max(self.context_tokens - self.max_new_tokens - PROMPT_TOKENS, 256)

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=0.0, max_new_tokens=self.max_new_tokens)


class JudgeUnavailable(InputError):
    """The judge cannot be reached or loaded (a clear error, before or while judging)."""


def _served_engine(cfg: JudgeConfig, timeout_s: float = 300.0, **retry: float) -> Any:
    """The client of a served judge (`retry`: the engine's retry_s, when not its default)."""
    from rose_ray.inference.engine import EngineConfig
    from rose_ray.inference.openai import OpenAIEngine, flag_key_env

    base_url = cfg.model[len("openai:"):].rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise JudgeUnavailable(f"--judge {cfg.model}: expected openai:http://HOST:PORT/v1")
    return OpenAIEngine(EngineConfig.of("openai", base_url=base_url, model=cfg.served_model,
                                        context_tokens=cfg.context_tokens, max_batch_size=cfg.concurrency,
                                        timeout_s=timeout_s, api_key_env=flag_key_env("--judge"), **retry))


def check_judge(cfg: JudgeConfig) -> JudgeConfig:
    """Fail before any game is played when the judge is not there. Returns the config to judge
    with (a local model's context capped at its positions)."""
    if cfg.served:
        from rose_ray.inference.openai import OpenAIServerError

        # Asked once (retry_s 0): not there now is an error now, not after a minute of backoff.
        engine = _served_engine(cfg, timeout_s=30.0, retry_s=0.0)
        try:
            models = engine.models()
        except OpenAIServerError as e:  # no answer (the message says "cannot reach"), or refused
            hint = f" ({engine.key_hint()})" if e.status in (401, 403) else ""
            raise JudgeUnavailable(f"--judge {cfg.model}: {e}{hint}") from None
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
    """Asks one judge model; `answer` returns (text, error); `close` ends its engine or client."""

    def __init__(self, cfg: JudgeConfig) -> None:
        self.cfg = cfg
        if cfg.served:
            self.engine = _served_engine(cfg)
            self.close: Callable[[], None] = self.engine.close
        else:
            from rose_ray.inference.engine import EngineConfig
            from rose_ray.rollout.actors import start_agents, stop_agents

            engine = EngineConfig(model=cfg.model, dtype=cfg.dtype, context_tokens=cfg.context_tokens,
                                  max_batch_size=cfg.concurrency)
            self.agent, _ = start_agents(engine, None, enable_thinking=bool(cfg.thinking))
            self.close = lambda: stop_agents(self.agent)

    async def answer(self, messages: list[dict[str, str]], request_id: str) -> tuple[str, str]:
        """(the judge's text, "") or ("", why it could not answer); JudgeUnavailable when the server
        cannot be reached at all."""
        from rose_ray.inference.engine import GenerationRequest
        from rose_ray.inference.openai import OpenAIServerError, OpenAIServerGone

        if self.cfg.served:
            try:
                text, _ = await asyncio.to_thread(self.engine.chat, messages, self.cfg.sampling(), self.cfg.thinking,
                                                  json_object=True)
            except OpenAIServerGone as e:
                raise JudgeUnavailable(f"judge {self.cfg.model}: {e}") from None
            except OpenAIServerError as e:  # a refused request, or an answer without a message
                return "", f"the judge server did not answer this question: {e}"
        else:
            ids = self.agent.chat.render_ids(messages, add_generation_prompt=True)
            result = await self.agent.engine.generate.remote(
                GenerationRequest(prompt_ids=ids, sampling=self.cfg.sampling(), request_id=request_id))
            if result.finish_reason == "context":
                return "", f"the prompt ({len(ids)} tokens) does not fit the judge's context"
            text = result.text
        return text, ""


# --------------------------------------------------------------------------- scoring
def judge_records(records: list[dict[str, Any]], cfg: JudgeConfig, cache: VerdictCache,
                  source: str = "thoughts") -> dict[str, int]:
    """Judge every critical question of the records on their `source` text, cut to fit; sets each
    such record's `verdicts`, `knowledge`, `knowledge_from` and `judge`. The judge starts only for
    what the cache lacks. Returns counts: questions, asked, cached, unparsed, errors, cut."""
    if source not in KNOWLEDGE_SOURCES:
        raise InputError(f"knowledge from: must be one of {KNOWLEDGE_SOURCES}, got {source!r}")
    # (record, its knowledge cut to fit, whether cut) for each record with critical questions
    judged = [(r, *fit_knowledge((r.get(source) or "").strip(), cfg.knowledge_chars))
              for r in records if r.get("critical_questions")]
    jobs = [(r, q, knowledge) for r, knowledge, _ in judged for q in r["critical_questions"]]
    verdicts: dict[tuple[str, str], Verdict] = {}
    todo: dict[tuple[str, str], str] = {}  # (question, knowledge) -> the task description
    for r, q, knowledge in jobs:
        key = (q, knowledge)
        if key in verdicts or key in todo:
            continue
        hit = cache.get(cfg.cache_name, q, knowledge)
        if hit is not None:
            verdicts[key] = hit
        elif not knowledge:  # the agent wrote nothing: nothing to judge
            verdicts[key] = Verdict(q, 0, True, f"the agent's {source} are empty" if source == "thoughts"
                                    else "the agent reported nothing")
        else:
            todo[key] = str(r.get("task_description") or "")
    if todo:
        from rose_ray.event_loop import run_coroutine

        judge = Judge(cfg)
        try:
            verdicts.update(run_coroutine(lambda: _ask_all(judge, todo, cache)))  # a notebook's loop too
        finally:
            judge.close()
    counts = {"questions": len(jobs), "asked": len(todo), "cached": 0, "cut": 0}
    for r, knowledge, cut in judged:
        got = [verdicts[(q, knowledge)] for q in r["critical_questions"]]
        r["verdicts"] = [v.to_dict() for v in got]
        r["knowledge"] = sum(v.verdict for v in got) / len(got)
        r["knowledge_from"] = source
        r["judge"] = cfg.name
        counts["cut"] += cut
        counts["cached"] += sum(v.cached for v in got)
    return {**counts, **verdict_counts([v for r, _, _ in judged for v in r["verdicts"]])}


def verdict_counts(verdicts: list[dict[str, Any]]) -> dict[str, int]:
    """Of some verdicts (as recorded): how many had no readable verdict, how many no answer."""
    return {"unparsed": sum(not v["parsed"] and not v.get("error") for v in verdicts),
            "errors": sum(bool(v.get("error")) for v in verdicts)}


async def _ask_all(judge: Judge, todo: dict[tuple[str, str], str],
                   cache: VerdictCache) -> dict[tuple[str, str], Verdict]:
    limit = asyncio.Semaphore(judge.cfg.concurrency)
    scorer = judge.cfg.scorer

    async def one(n: int, key: tuple[str, str]) -> tuple[tuple[str, str], Verdict]:
        question, knowledge = key
        task = todo[key]
        async with limit:
            text, error = await judge.answer(scorer.judge_messages(task, knowledge, question), f"judge/{n}")
        if error:  # not cached: a later run asks again
            return key, Verdict(question, 0, False, "", error)
        verdict = Verdict(question, *scorer.read_verdict(text))  # unreadable: 0, unparsed
        cache.put(judge.cfg.cache_name, knowledge, verdict, text)
        return key, verdict

    return dict(await asyncio.gather(*(one(n, k) for n, k in enumerate(todo))))
