# nbgrader reads this file when it runs from the repository root; the settings live in autograder/.
c = get_config()  # noqa: F821 (provided by traitlets)
load_subconfig("autograder/nbgrader_config.py")  # noqa: F821 (relative to this file, not the cwd)
