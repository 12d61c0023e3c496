"""Run management: run directories created, locked, trained into and resumed (:mod:`~dfcil.runs.runner`), and
stopping cleanly on a signal (:mod:`~dfcil.runs.signals`)."""
