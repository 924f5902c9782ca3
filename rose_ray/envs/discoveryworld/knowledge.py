"""DiscoveryWorld's knowledge scorer, as its paper's (`scripts/knowledgeScorer.py`): the judge's
prompt for one critical question, the agent's knowledge (its numbered thoughts) and the judge's
JSON answer read as a verdict (`rose_ray/judge.py` asks the judge).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from rose_ray.envs.protocol import parse_thought, strip_thinking

JUDGE_PROMPT = """You are grading what an agent found out while playing a game about scientific discovery: \
has it worked out the discovery that its task asks for?

You get three things: (1) the task description, (2) the agent's knowledge, and (3) one critical \
question about the discovery, which you answer with true (1) or false (0).

Task description:
```
{task}
```

Agent's knowledge:
```
{knowledge}
```

Critical question:
```
{question}
```

Answer 1 if the agent's knowledge shows that it has found out what the critical question asks \
about, and 0 otherwise. Reply with one JSON object with exactly these three keys:
{{"criticalQuestion": "<the critical question, repeated>", "evaluation": <0 or 1, as an integer>, \
"explanation": "<a short reason for the evaluation, referring to the agent's knowledge and whether it \
shows what the critical question asks>"}}"""


def episode_thoughts(replies: list[str]) -> str:
    """The agent's knowledge as the paper reads a ReAct agent's: each reply's thought, numbered."""
    thoughts = [t for t in (parse_thought(r) for r in replies) if t]
    return "".join(f"Thought {n}: {t}\n" for n, t in enumerate(thoughts, 1))


def judge_messages(task: str, knowledge: str, question: str) -> list[dict[str, str]]:
    """The judge's one user message for one critical question."""
    return [{"role": "user", "content": JUDGE_PROMPT.format(task=task.strip() or "(not given)",
                                                            knowledge=knowledge, question=question.strip())}]


PROMPT_HASH = hashlib.sha256(JUDGE_PROMPT.encode()).hexdigest()[:8]  # in a judge cache's name: a new prompt asks again

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL | re.IGNORECASE)


def _json_object(text: str) -> dict[str, Any] | None:
    """The answer's JSON object: the whole answer, a ```json fence's inside, or else its one {...}."""
    fenced = _FENCE.match(text)
    start, end = text.find("{"), text.rfind("}")  # a slice that is no object when there is none
    for candidate in [fenced.group(1)] if fenced else [text, text[start:end + 1]]:
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        return obj if isinstance(obj, dict) else None
    return None


def read_verdict(text: str) -> tuple[int, bool, str]:
    """A judge's answer as (verdict, parsed, explanation): its JSON's `evaluation`, an integer
    0 or 1, and `explanation`; anything else is unparsed, verdict 0."""
    obj = _json_object(strip_thinking(str(text or "")).strip())
    if obj is None:
        return 0, False, ""
    explanation = " ".join(str(obj.get("explanation") or "").split())[:500]
    value = obj.get("evaluation")
    if type(value) is not int or value not in (0, 1):  # bool is not an int here, as in the paper's scorer
        return 0, False, explanation
    return value, True, explanation
