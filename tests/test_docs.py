"""BUILD.md's example files (an action, a Task, their config) run as printed, from a
directory outside the repository, through launch.py and the `tftrainer` command; README
commands match CI."""

import json
import os
import re
import subprocess
import sys

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


def test_build_md_example_runs_with_launch_py_from_another_directory(tmp_path):
    log = run_example(tmp_path, [sys.executable, os.path.join(ROOT, "launch.py")])
    check_the_example_learns_and_stops(log)


def test_build_md_example_runs_with_the_console_command(tmp_path):
    command = os.path.join(os.path.dirname(sys.executable), "tftrainer")
    assert os.path.exists(command), "pip install -e . installs the tftrainer command"
    check_the_example_learns_and_stops(run_example(tmp_path, [command]))


def test_ci_runs_the_readme_test_command():
    readme = open(os.path.join(ROOT, "README.md")).read()
    blocks = re.findall(r"```\n(.*?)```", readme, re.S)
    test_command = next(b.strip() for b in blocks if "pytest" in b)
    assert test_command in open(os.path.join(ROOT, ".ci", "run")).read()


def test_config_files_import_only_the_shared_defaults_of_the_trainer():
    """A config is read before anything is built: it may import trainer/runtime/defaults.py,
    not the step's or the loop's modules."""
    configs = os.path.join(ROOT, "configs")
    for name in sorted(os.listdir(configs)):
        if name.endswith(".py"):
            imported = re.findall(r"^\s*(?:from|import) (trainer\S*)",
                                  open(os.path.join(configs, name)).read(), re.M)
            assert set(imported) <= {"trainer.runtime.defaults"}, (name, imported)


def test_each_layer_of_trainer_imports_only_the_layers_below_it():
    """BUILD.md's layers: runtime/, state/, step/, loop/, then outputs/ and modes/; a
    module-level import of a higher layer is refused (a call inside a function, as
    `Trainer.train`'s, is the documented exception)."""
    import ast
    order = {"runtime": 0, "state": 1, "step": 2, "loop": 3, "outputs": 4, "modes": 4,
             "assemble": 5, "cli": 5}
    upward = []
    for folder in ("runtime", "state", "step", "loop", "outputs", "modes"):
        for name in sorted(os.listdir(os.path.join(ROOT, "trainer", folder))):
            if not name.endswith(".py"):
                continue
            path = os.path.join(ROOT, "trainer", folder, name)
            for node in ast.parse(open(path).read()).body:
                modules = ([node.module] + [f"{node.module}.{a.name}" for a in node.names]
                           if isinstance(node, ast.ImportFrom) and node.module else
                           [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                upward += [f"trainer/{folder}/{name}: {m}" for m in modules
                           if m.startswith("trainer.")
                           and order.get(m.split(".")[1], -1) > order[folder]]
    assert not upward
