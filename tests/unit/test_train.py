"""End to end on a real local Ray cluster: a short tiny online-ROSE run, resume, Ctrl-C."""

from __future__ import annotations


def test_bad_config_is_rejected_with_the_key_named(tmp_path, capsys):
    from rose_ray.cli import main

    assert main(["train", f"run_dir={tmp_path}/r", "rollout.nonsense=1"]) == 2
    assert main(["train", f"run_dir={tmp_path}/r", "rollout.max_lag=-1"]) == 2
    capsys.readouterr()
    # The keys this redesign removed are named, with what took their place.
    assert main(["train", f"run_dir={tmp_path}/r", "learner.algorithm=opd"]) == 2
    assert "key 'learner.algorithm': removed; set `algorithm` only" in capsys.readouterr().err
    assert main(["train", f"run_dir={tmp_path}/r", "rollout.handoff.k=3"]) == 2
    assert "key 'rollout.handoff': removed; moved to algorithm.handoff" in capsys.readouterr().err
    assert main(["train", f"run_dir={tmp_path}/r", "learner.context_policy=end_episode"]) == 2
    assert "key 'learner.context_policy': removed; the learner cuts a trajectory where the engine cut it" in (
        capsys.readouterr().err)
    assert main(["train", f"run_dir={tmp_path}/r", "learner.grad_accum=2"]) == 2
    assert "key 'learner.grad_accum': removed; micro-batches follow a token budget" in capsys.readouterr().err
    assert main(["train", f"run_dir={tmp_path}/r", "learner.attn_implementation=flex"]) == 2
    assert "learner.attn_implementation: must be one of" in capsys.readouterr().err
    for bad, key in (("algorithm.handoff.p0=1.5", "algorithm.handoff.p0"),
                     ("algorithm.handoff.decay_steps=0", "algorithm.handoff.decay_steps")):
        assert main(["train", f"run_dir={tmp_path}/r", "algorithm.handoff.policy=decay", bad]) == 2
        assert f"{key}: must be" in capsys.readouterr().err
    # OPD's teacher reads each episode in one pass: it needs at least the student's context.
    assert main(["train", f"run_dir={tmp_path}/r", "algorithm=opd", "teacher_engine.context_tokens=1024"]) == 2
    assert "teacher_engine.context_tokens: 1024 is less than student_engine.context_tokens 2048" in capsys.readouterr().err
    assert not (tmp_path / "r" / "checkpoints").exists()
