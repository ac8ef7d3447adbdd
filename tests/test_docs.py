"""BUILD.md's example files (an action, a Task, their config) run as printed, from a
directory outside the repository, through launch.py and the `tftrainer` command; README
commands match CI."""

import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK = ["--config.precision=float32", "--config.distribution.strategy=default",
         "--config.trainer.steps_per_loop=50", "--config.trainer.log_every=50"]


def example_files(*paths):
    """{file name: code} of the ```python blocks whose first line is `# <name>.py`."""
    blocks = [block for path in paths for block in re.findall(
        r"```python\n# (\w+\.py)\n(.*?)```", open(os.path.join(ROOT, path)).read(), re.S)]
    return dict(blocks)


def final_summary(log):
    line = next(l for l in log.splitlines() if "] Done: " in l)
    return json.loads(line.split("] Done: ", 1)[1])


def run_example(tmp_path, command):
    project = tmp_path / "my_project"  # outside the repository
    project.mkdir()
    files = example_files("docs/add_a_task.md", "docs/add_an_action.md")
    assert set(files) == {"stop_at_accuracy.py", "sign_of_sum.py", "config.py"}
    for name, code in files.items():
        (project / name).write_text(code)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    run = subprocess.run([*command, f"--config={project / 'config.py'}",
                          f"--workdir={tmp_path / 'run'}", *QUICK], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stderr


def check_the_example_learns_and_stops(log):
    summary = final_summary(log)
    assert summary["eval"]["accuracy"] > 0.85
    assert summary["eval"]["num_examples"] == 1024
    # the example action ended the run at the first eval reaching its target
    assert summary["steps"] < 200 and summary["stopped"].startswith("eval/accuracy=")
    assert "reached the target 0.85" in summary["stopped"]


@pytest.mark.e2e
def test_build_md_example_runs_with_launch_py_from_another_directory(tmp_path):
    log = run_example(tmp_path, [sys.executable, os.path.join(ROOT, "launch.py")])
    check_the_example_learns_and_stops(log)


@pytest.mark.e2e
def test_build_md_example_runs_with_the_console_command(tmp_path):
    command = os.path.join(os.path.dirname(sys.executable), "tftrainer")
    assert os.path.exists(command), "pip install -e . installs the tftrainer command"
    check_the_example_learns_and_stops(run_example(tmp_path, [command]))


def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```\n(.*?)```", readme, re.S)
    test_command = next(b.strip() for b in blocks if "pytest" in b)
    assert test_command in open(os.path.join(ROOT, ".ci", "run")).read()


def test_each_layer_of_trainer_imports_only_the_layers_below_it():
    """BUILD.md's layers: runtime/, then state/, data/ and the Task contract, step/, loop/,
    actions/, modes/, then assemble and cli; a module-level import of a higher layer is
    refused (a call inside a function, as `Trainer.train`'s, is the documented exception)."""
    import ast
    order = {"runtime": 0, "state": 1, "data": 1, "task": 1, "step": 2, "loop": 3,
             "actions": 4, "modes": 5, "assemble": 6, "cli": 6}
    upward = []
    for folder, _, names in os.walk(os.path.join(ROOT, "trainer")):
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, name)
            parts = os.path.relpath(path, os.path.join(ROOT, "trainer")).split(os.sep)
            layer = parts[0] if len(parts) > 1 else name[:-3]
            if layer not in order:
                continue
            for node in ast.parse(open(path).read()).body:
                modules = ([node.module] + [f"{node.module}.{a.name}" for a in node.names]
                           if isinstance(node, ast.ImportFrom) and node.module else
                           [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                upward += [f"{os.path.relpath(path, ROOT)}: {m}" for m in modules
                           if m.split(".")[0] == "tasks" or (
                               m.startswith("trainer.")
                               and order.get(m.split(".")[1], -1) > order[layer])]
    assert not upward
