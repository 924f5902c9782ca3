"""The recipes (rose_ray/recipes/: rose.py, opd.py, teacher_sft.py and the `Recipe` contract in
__init__.py) as objects: whether each makes the teacher score the student's tokens, which
tokens each trains, the checks that name their key. Elsewhere: the section read from YAML and
its one-line description (tests/unit/test_config.py), the loss each recipe's weights give
(tests/unit/learner/test_losses.py), OPD refused by `rose-ray check` across tokenizers
(tests/unit/test_check.py); offline SFT and the warm-ups have test_sft.py and test_warmup.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rose_ray.errors import ConfigError
from rose_ray.recipes import get_recipe
from rose_ray.recipes.opd import OnPolicyDistillation
from rose_ray.recipes.rose import Rose
from rose_ray.recipes.teacher_sft import TeacherSFT
from rose_ray.rollout.handoff import turn_policy
from rose_ray.tokens import TokenWeights

# The two models' names, as check_agents reads them from the config.
MODELS = SimpleNamespace(student_engine=SimpleNamespace(model="org/student"),
                         teacher_engine=SimpleNamespace(model="other/teacher"))


def test_the_teacher_scores_the_students_tokens_only_where_a_term_needs_them():
    """OPD always; rose only with λ > 0 (then the student's own tokens carry λ·OPD); never
    teacher_sft."""
    assert OnPolicyDistillation().teacher_scores_student()
    assert OnPolicyDistillation().token_weights() == TokenWeights(opd={"student": 1.0})
    assert not Rose().teacher_scores_student()
    assert Rose().token_weights().trains("teacher") and not Rose().token_weights().trains("student")
    assert Rose(lam=0.5).teacher_scores_student()
    assert Rose(lam=0.5).token_weights() == TokenWeights(ce={"teacher": 1.0}, opd={"student": 0.5})
    assert not TeacherSFT().teacher_scores_student()
    assert TeacherSFT().token_weights() == TokenWeights(ce={"student": 1.0, "teacher": 1.0})


def test_scoring_across_two_tokenizers_is_refused_naming_the_key_that_asked_for_it():
    with pytest.raises(ConfigError, match=r"^algorithm: OPD needs .* org/student and other/teacher do not"):
        OnPolicyDistillation().check_agents(MODELS, shared_tokenizer=False)
    with pytest.raises(ConfigError, match=r"^algorithm.lam: OPD needs the teacher to score"):
        Rose(lam=0.5).check_agents(MODELS, shared_tokenizer=False)
    Rose(lam=0.5).check_agents(MODELS, shared_tokenizer=True)
    Rose().check_agents(MODELS, shared_tokenizer=False)  # λ 0: the teacher's text is re-tokenized, no scores
    TeacherSFT().check_agents(MODELS, shared_tokenizer=False)


def test_teacher_sft_owners_are_a_nonempty_subset_of_the_owners():
    for owners in ([], ["teacher", "judge"]):
        with pytest.raises(ConfigError, match=r"algorithm.owners: must be a non-empty subset of"):
            TeacherSFT(owners=owners)
    assert TeacherSFT(owners=["teacher"]).turn_policy() == turn_policy("teacher_only")


def test_a_recipe_is_chosen_by_name_mapping_or_as_itself():
    assert get_recipe("opd") == OnPolicyDistillation()
    assert get_recipe({"name": "rose", "lam": 0.5, "handoff": {"policy": "fixed", "k": 3}}) == \
        Rose(lam=0.5, handoff={"policy": "fixed", "k": 3})
    sft = TeacherSFT(owners=["teacher"])
    assert get_recipe(sft) is sft
    with pytest.raises(ConfigError, match="algorithm: expected a name or a mapping with 'name', got 3"):
        get_recipe(3)
