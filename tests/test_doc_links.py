"""Every cross-reference resolves: the markdown links of README.md, BUILD.md and docs/*.md
(a local file, and an #anchor in it by GitHub's rules), and the references that code
and docs make in text: `docs/<page>.md#<anchor>`, `BUILD.md#<anchor>`,
`BUILD.md, "Heading"`, `README, 'Heading'`. A renamed heading or a moved page fails
here, not in a reader's browser."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where code refers to the docs: every file of these folders (.py, and examples'
# scripts and manifests), and launch.py.
CODE = ("trainer", "tasks", "configs", "benchmarks", "examples")
CODE_SUFFIXES = (".py", ".yaml", ".yml", ".sbatch", ".sh")

FENCE = re.compile(r"^ {0,3}(```|~~~)[^\n]*\n.*?^ {0,3}\1[^\n]*$", re.M | re.S)
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# References in text: a path with an anchor, a page without one, a heading by name.
PATH_ANCHOR = re.compile(r"(?<![\w/.-])((?:\.\./)?(?:docs/[\w.-]+\.md|BUILD\.md|README\.md))"
                         r"#([\w-]+)")
DOCS_PAGE = re.compile(r"(?<![\w/.-])(docs/[\w.-]+\.md)(?![\w#-])")
BY_NAME = re.compile(r"\b(BUILD\.md|README(?:\.md)?),?[ \t]+(\"|')([^\"'\n]+)\2")


def anchor(heading):
    """GitHub's anchor of a heading: lowercase, punctuation but '-' and '_' dropped,
    spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text):
    """The anchors of a markdown text's headings (outside code blocks), with GitHub's
    -1, -2 ... for repeats."""
    seen, found = {}, set()
    for _, heading in HEADING.findall(FENCE.sub("", text)):
        base = anchor(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _anchors_of(path, cache={}):
    if path not in cache:
        cache[path] = anchors(_read(path))
    return cache[path]


def _resolve(target, anchor_name, where, root):
    """What is wrong with a reference to `target` (a path, absolute) and `anchor_name`
    ("" for none), or None."""
    if not os.path.exists(target):
        return f"{where}: {os.path.relpath(target, root)} does not exist"
    if anchor_name:
        if not target.endswith(".md"):
            return None  # an anchor into code: GitHub's line anchors, not checked
        if anchor_name not in _anchors_of(target):
            return (f"{where}: {os.path.relpath(target, root)} has no heading "
                    f"#{anchor_name}")
    return None


def markdown_link_errors(path, text, root=ROOT):
    """Broken markdown links of the file `path` whose content is `text`."""
    errors = []
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    for target in LINK.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor_name = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
            if file_part else path
        where = f"{os.path.relpath(path, root)} [..]({target})"
        error = _resolve(full, anchor_name, where, root)
        if error:
            errors.append(error)
    return errors


def text_reference_errors(path, text, root=ROOT):
    """Broken references in the text of `path` (code or docs) of the forms
    `docs/<page>.md#<anchor>`, `docs/<page>.md`, `BUILD.md#<anchor>`,
    `BUILD.md, "Heading"` and `README, 'Heading'`; paths are from the repository root."""
    errors = []
    rel = os.path.relpath(path, root)
    for page, anchor_name in PATH_ANCHOR.findall(text):
        target = os.path.join(root, page[3:] if page.startswith("../") else page)
        error = _resolve(target, anchor_name, f"{rel}: {page}#{anchor_name}", root)
        if error:
            errors.append(error)
    for page in DOCS_PAGE.findall(text):
        error = _resolve(os.path.join(root, page), "", f"{rel}: {page}", root)
        if error:
            errors.append(error)
    for page, _, heading in BY_NAME.findall(text):
        target = os.path.join(root, "BUILD.md" if page == "BUILD.md" else "README.md")
        error = _resolve(target, anchor(heading), f"{rel}: {page}, {heading!r}", root)
        if error:
            errors.append(error)
    return errors


def doc_files(root=ROOT):
    return [os.path.join(root, "README.md"), os.path.join(root, "BUILD.md"),
            *sorted(glob.glob(os.path.join(root, "docs", "*.md")))]


def code_files(root=ROOT):
    files = [os.path.join(root, "launch.py")]
    for top in CODE:
        for folder, _, names in os.walk(os.path.join(root, top)):
            files += [os.path.join(folder, n) for n in sorted(names)
                      if n.endswith(CODE_SUFFIXES)]
    return [f for f in files if os.path.isfile(f)]


def test_markdown_links_of_the_docs_resolve():
    errors = [e for path in doc_files() for e in markdown_link_errors(path, _read(path))]
    assert not errors, "\n".join(errors)


def test_references_in_the_docs_resolve():
    errors = [e for path in doc_files() for e in text_reference_errors(path, _read(path))]
    assert not errors, "\n".join(errors)


def test_references_in_the_code_resolve():
    errors = [e for path in code_files() for e in text_reference_errors(path, _read(path))]
    assert not errors, "\n".join(errors)


def test_every_docs_page_is_reachable_from_the_readme_or_build_md():
    """A page nobody links to is a page nobody reads."""
    linked = set()
    pending = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "BUILD.md")]
    while pending:
        path = pending.pop()
        if path in linked or not path.endswith(".md") or not os.path.exists(path):
            continue
        linked.add(path)
        prose = CODE_SPAN.sub("", FENCE.sub("", _read(path)))
        pending += [os.path.normpath(os.path.join(os.path.dirname(path),
                                                  t.partition("#")[0]))
                    for t in LINK.findall(prose) if t.partition("#")[0]
                    and not re.match(r"^[a-z][a-z0-9+.-]*:", t)]
    unreached = sorted(os.path.relpath(p, ROOT) for p in doc_files() if p not in linked)
    assert not unreached


@pytest.mark.parametrize("heading, expected", [
    ("From `launch.py` to `train_step`", "from-launchpy-to-train_step"),
    ("XLA: trainer.jit_compile", "xla-trainerjit_compile"),
    ("Evaluation, the best checkpoint, early stopping",
     "evaluation-the-best-checkpoint-early-stopping"),
    ("Way 1: write TF_CONFIG from the scheduler's environment",
     "way-1-write-tf_config-from-the-schedulers-environment"),
    ("summary.json", "summaryjson"),
])
def test_anchors_follow_github(heading, expected):
    assert anchor(heading) == expected


def test_a_broken_reference_is_found(tmp_path):
    """The checks fail on what they are for: a missing page, a missing heading, in a
    link, a path reference, a reference by name, and never read code blocks' headings."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "BUILD.md").write_text("# Build\n\n## The layers\n\n```python\n"
                                       "# not_a_heading.py\n```\n")
    (tmp_path / "README.md").write_text("# Readme\n\n## Security\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text("# Page\n\n### A topic\n\n### A topic\n")
    good = ("[a](../BUILD.md#the-layers) [b](#a-topic-1) [c](page.md) "
            "[d](https://example.com/x#y) `[e](nowhere.md)`\n")
    assert markdown_link_errors(str(page), good, str(tmp_path)) == []
    bad = ("[a](../BUILD.md#layers) [b](#a-topic-2) [c](gone.md) "
           "[d](../BUILD.md#not_a_headingpy)\n")
    assert len(markdown_link_errors(str(page), bad, str(tmp_path))) == 4
    code = tmp_path / "code.py"
    good = ('"see docs/page.md#a-topic"  # BUILD.md, "The layers"; README, \'Security\'\n'
            "# docs/page.md, BUILD.md#the-layers\n")
    assert text_reference_errors(str(code), good, str(tmp_path)) == []
    bad = ('"see docs/page.md#another-topic"  # BUILD.md, "Layers"; README, \'Safety\'\n'
           "# docs/gone.md, BUILD.md#layout, docs/gone.md#a-topic\n")
    assert len(text_reference_errors(str(code), bad, str(tmp_path))) == 6
