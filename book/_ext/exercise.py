"""The ``exercise`` directive: a box on a chapter page that sends the reader to the chapter's notebook.

    ```{exercise} 01-tokens
    Optional text, parsed as MyST: what the notebook asks you to build.
    ```

renders a "Launch on Binder" link for ``notebooks/01-tokens/01-tokens.ipynb``, a link to that notebook's
page in this book and one line on how the work is checked: by the notebook's test cells, and by hidden tests once
handed in (``:ungraded:`` on the line after the name says instead that nothing is graded, for the capstone). The
instructor's preview says the same as the student release's website: learners have no ``minigpt-grade``. The Binder
URL is built from the settings the theme's own launch buttons use (``launch_buttons`` and ``repository`` in
``_config.yml``), so the two cannot disagree. A missing notebook or a notebook page left out of ``_toc.yml`` is a
build warning, which ``-W`` turns into an error.

One setting serves the student release (``autograder/publish/student_release.py``), whose repository holds the
notebooks but not the chapter pages' sources: ``exercise_launch_buttons_only`` keeps the theme's launch buttons on
exercise pages only.
"""
from pathlib import Path
from urllib.parse import quote, urlparse

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.errors import ConfigError
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

# The same prefixes sphinx-book-theme uses for its launch buttons.
INTERFACE_PREFIXES = {"classic": "tree", "jupyterlab": "lab/tree"}


def binder_url(theme_options: dict, path_in_repo: str) -> str:
    """Binder link that opens ``path_in_repo`` (relative to the repository root)."""
    launch = theme_options.get("launch_buttons", {})
    binderhub = launch.get("binderhub_url", "").strip("/")
    repo_url = theme_options.get("repository_url", "").rstrip("/")
    if not binderhub or not repo_url:
        raise ConfigError("exercise: set launch_buttons.binderhub_url and repository.url in _config.yml")
    interface = launch.get("notebook_interface", "classic")
    if interface not in INTERFACE_PREFIXES:
        raise ConfigError(f"exercise: notebook_interface must be one of {sorted(INTERFACE_PREFIXES)}")
    branch = theme_options.get("repository_branch") or "master"  # the theme's default too

    parsed = urlparse(repo_url)
    project = parsed.path.strip("/").removesuffix(".git")
    if parsed.netloc == "github.com":  # BinderHub's own providers, as the theme's buttons use them: gh/ORG/REPO/REF
        org, repo = project.split("/")[:2]
        spec = f"gh/{org}/{repo}/{branch}"
    elif parsed.netloc == "gitlab.com":  # gl/ then the project's whole path, subgroups too, its slashes escaped
        spec = f"gl/{quote(project, safe='')}/{branch}"
    else:
        spec = f"git/{quote(repo_url, safe='')}/{branch}"
    return f"{binderhub}/v2/{spec}?urlpath={INTERFACE_PREFIXES[interface]}/{path_in_repo}"


class ExerciseDirective(SphinxDirective):
    required_arguments = 1  # the exercise name, e.g. 01-tokens
    has_content = True
    option_spec = {"ungraded": directives.flag}  # a notebook with nothing to grade (the capstone)

    def run(self) -> list[nodes.Node]:
        name = self.arguments[0]
        docname = f"notebooks/{name}/{name}"  # relative to the book root
        notebook = f"{docname}.ipynb"
        if not Path(self.env.srcdir, notebook).is_file():
            logger.warning(f"exercise {name!r}: {notebook} does not exist", location=self.get_location())

        theme_options = self.config.html_theme_options
        book_path = theme_options.get("path_to_docs", "").strip("/")
        path_in_repo = f"{book_path}/{notebook}" if book_path else notebook

        box = nodes.admonition(classes=["exercise"])
        box += nodes.title(text=f"Exercise: {name}")
        self.set_source_info(box)
        if self.content:
            self.state.nested_parse(self.content, self.content_offset, box)

        launch = nodes.reference(
            "",
            "Launch on Binder",
            refuri=binder_url(theme_options, path_in_repo),
            # sd-btn: sphinx-design, loaded by Jupyter Book, draws it as a button.
            classes=["binder-exercise-link", "sd-btn", "sd-btn-primary"],
        )
        page = addnodes.pending_xref(
            "",
            nodes.inline("", "read the notebook here", classes=["xref", "std", "std-doc"]),
            refdomain="std",
            reftype="doc",
            reftarget=f"/{docname}",
            refexplicit=True,
            refwarn=True,
            refdoc=self.env.docname,
        )
        box += nodes.paragraph("", "", launch, nodes.Text(" or "), page, nodes.Text("."))

        if "ungraded" in self.options:
            box += nodes.paragraph("", "Nothing in this notebook is graded: run it from the top whenever you want "
                                       "to know where your package stands.")
        else:
            box += nodes.paragraph(
                "",
                "The test cell under each function checks your work as you go; when you hand the notebook in, "
                "hidden tests grade it.",
            )
        return [box]


def keep_launch_buttons_on_exercises(app, pagename, templatename, context, doctree):
    """Drop the theme's launch buttons from pages outside ``notebooks/`` (runs after the theme adds them), and give
    its Binder button the link of ``binder_url``: for a host other than github.com or gitlab.com the theme escapes
    the repository's address with its slashes left in, and BinderHub's ``git/`` provider reads the address up to
    the first slash."""
    buttons = context.get("header_buttons", [])
    if app.config.exercise_launch_buttons_only and not pagename.startswith("notebooks/"):
        buttons[:] = [b for b in buttons if b.get("label") != "launch-buttons"]
    for group in buttons:
        for button in group.get("buttons", []) if group.get("label") == "launch-buttons" else []:
            if button.get("text") == "Binder" and "?urlpath=" in button.get("url", ""):
                path_in_repo = button["url"].split("?urlpath=", 1)[1].split("tree/", 1)[1]
                button["url"] = binder_url(app.config.html_theme_options, path_in_repo)


def setup(app):
    app.add_config_value("exercise_launch_buttons_only", False, "html", [bool])
    app.connect("html-page-context", keep_launch_buttons_on_exercises, priority=600)
    app.add_directive("exercise", ExerciseDirective)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
