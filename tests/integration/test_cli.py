"""The half of tests/unit/test_cli.py whose tests start processes
(Ray, JVMs, servers or commands); that file's docstring says what both halves check."""

from __future__ import annotations

import subprocess
import sys


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rose_ray.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_games_lists_the_catalogue_without_a_jvm():
    out = run_cli("games")
    assert out.returncode == 0
    assert "mapping agentgym: 4639 games, 23 tasks" in out.stdout
    assert "2312" in out.stdout and "1156" in out.stdout and "1171" in out.stdout
    assert "4339" in run_cli("games", "--mapping", "agentgym_traj").stdout
    bad = run_cli("games", "--show", "sciworld_99999")
    assert bad.returncode == 2 and "outside the 'agentgym' mapping" in bad.stderr


def test_play_goes_through_the_model_protocol():
    out = run_cli("play", "sciworld_0", stdin="open door to kitchen\nThought: hm\\nAction: focus on orange\n")
    assert out.returncode == 0, out.stderr
    assert "Your task is to boil water." in out.stdout and "Thought:" in out.stdout  # the instruction
    assert "The door is now open." in out.stdout
    assert "Episode over: score -100 (0.00), turns 2, failed" in out.stdout


def test_version_is_the_packages():
    from importlib.metadata import version

    import rose_ray

    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"rose-ray {rose_ray.__version__}"
    assert version("rose_ray") == rose_ray.__version__  # pyproject takes it from rose_ray.__version__


def test_the_python_api_is_the_commands_and_import_stays_light():
    """`rose_ray.train(...)` and `rose_ray.evaluate(...)` call the commands' functions whether or not
    their modules were imported before (a submodule replaces a function of its name); `import
    rose_ray` loads no torch."""
    code = (
        "import sys, types, rose_ray\n"
        "assert 'torch' not in sys.modules\n"
        "import rose_ray.train, rose_ray.evaluate\n"
        "from rose_ray.train import train\n"
        "from rose_ray.evaluate import evaluate\n"
        "for module, function in ((rose_ray.train, train), (rose_ray.evaluate, evaluate)):\n"
        "    assert isinstance(module, types.ModuleType) and callable(module)\n"
        "    assert getattr(module, module.__name__.rsplit('.', 1)[1]) is function\n"
        "from rose_ray.errors import ConfigError\n"
        "try:\n"
        "    rose_ray.evaluate(no_such_setting=1)\n"
        "except ConfigError as e:\n"
        "    assert \"no setting 'no_such_setting'\" in str(e), e\n"
        "else:\n"
        "    raise AssertionError('evaluate took an unknown setting')\n"
        "try:\n"
        "    rose_ray.train(None, ['steps=0'])\n"
        "except ConfigError as e:\n"
        "    assert 'steps: must be >= 1' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('train took steps=0')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
