"""JupyterLab opens the chapter pages (MyST Markdown, ``book/*.md``) as notebooks, not as text.

    python tools/lab_settings.py           # write the setting into this environment's JupyterLab
    python tools/lab_settings.py --check   # exit 1 if this environment's JupyterLab lacks it

A chapter page's launch button opens ``book/NN-topic.md`` on Binder. JupyterLab's default viewer for Markdown is
the text editor; jupytext (installed with the course) adds a "Jupytext Notebook" viewer that runs such a file as a
notebook. This writes ``overrides.json`` into ``<sys.prefix>/share/jupyter/lab/settings``, the environment's own
settings (not the user's), so Binder (``postBuild``) and ``make env`` get the same JupyterLab.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

PLUGIN = "@jupyterlab/docmanager-extension:plugin"
# JupyterLab's file types for .md; jupytext registers the "Jupytext Notebook" widget factory for both.
VIEWERS = {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}


def overrides_file(prefix: str = sys.prefix) -> Path:
    return Path(prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"


def with_setting(overrides: dict) -> dict:
    """``overrides`` with the default viewers set, every other setting kept."""
    plugin = dict(overrides.get(PLUGIN, {}))
    plugin["defaultViewers"] = {**plugin.get("defaultViewers", {}), **VIEWERS}
    return {**overrides, PLUGIN: plugin}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = overrides_file()
    current = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    wanted = with_setting(current)
    if args == ["--check"]:
        if current != wanted:
            print(f"{path} does not open book/*.md as notebooks: run python tools/lab_settings.py", file=sys.stderr)
            return 1
        return 0
    if args:
        print(__doc__, file=sys.stderr)
        return 2
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(wanted, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
