"""Experiment tooling outside the library: runners, aggregators and probes of the project's studies
one folder a topic (lab/study: the toy study of issue 11). The library (src/tapa) never imports it; run its modules
from the repository root, e.g. `PYTHONPATH=src python3 -m lab.study.run --help`."""
