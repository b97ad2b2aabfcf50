"""The recipes of docs/python.md run as written and print what the page says."""

import os
import re
import subprocess
import sys

import pytest

RECIPE = re.compile(r"<!-- recipe: (\w+) -->\n```python\n(.*?)```\n\nIt prints\n\n```\n(.*?)```", re.S)


def recipes(docs):
    found = RECIPE.findall((docs / "python.md").read_text())
    assert [name for name, _, _ in found] == ["torch", "optimum"], "docs/python.md lost a recipe"
    return {name: (code, printed) for name, code, printed in found}


@pytest.mark.parametrize("name", ["torch", "optimum"])
def test_recipe(name, docs, tmp_path):
    code, printed = recipes(docs)[name]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    # The exporters print progress of their own; the recipe's lines end the output.
    assert done.stdout.endswith(printed), done.stdout[-2000:]
