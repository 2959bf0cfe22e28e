"""The Dagster layer's orchestration, installed as ``stage2_pipelines`` (the folder is ``pipelines/``).

Modules, each importing only those before it (no cycle, nothing built at import):
  ``config``      where settings and paths come from (``BuildConfig``, ``STAGE2_*`` variables)
  ``executors``   where a run's steps execute (in process, subprocesses, Dask, Kubernetes)
  ``rebuild``     a rebuild as Dagster runs, as `stage2 build` runs it (``stage2_data.stages``)
  ``schedules``, ``sensors``
  ``definitions`` the Definitions (``defs``, built on first use, is what ``workspace.yaml`` loads)
  ``uptodate``    the no-op build, answered before Dagster is imported
  ``watch``       a stage's run followed partition by partition (progress inside the run)
  ``runner``      ``stage2 build``: every stage as Dagster runs in one process
  ``commands``    the ``stage2 build`` / ``stage2 demo`` commands (a plugin of the core CLI)
  ``progress``    their progress display (rich; imported when a build runs)
  ``ui``          ``make ui``
Asset names, stages and job names live in ``stage2_data.stages``; assets in ``stage2_assets``,
resources in ``stage2_resources``.
"""
