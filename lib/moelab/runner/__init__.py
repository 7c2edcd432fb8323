"""The run layer (top of ``moelab``, below the notebooks): everything that decides where a notebook's outputs go,
never what they contain.

- :mod:`moelab.runner.cli`: the papermill runner behind ``make figures`` / ``make test`` (``python -m moelab.runner``).
- :mod:`moelab.runner.notebook_run`: :class:`~moelab.runner.notebook_run.NotebookRun` (``moelab.start_run``): figures,
  tables, provenance, publishing, and the notebook -> claim definitions table.
- :mod:`moelab.runner.markdown`: the executed notebook as ``notebook.md``.
- :mod:`moelab.runner.lab`: JupyterLab's contents manager for the jupytext ``.py`` notebooks.

None of it is part of an artifact's cache key or of a published folder's sources (``moelab.cache.NOT_IN_KEYS``,
``notebook_run.VERDICT_CODE``), so moving or editing it never retrains anything and never makes a folder stale.
"""
