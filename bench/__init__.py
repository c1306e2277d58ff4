"""Speed benchmarks. Run each from the repository root as a module, e.g. ``python -m bench.release``, so
``bench``, ``entrypoint`` and ``tests`` (the local Hub and provider fakes under ``tests/fakes/``) import as
packages. Results go to ``bench/results/`` and docs/benchmarks.md."""
