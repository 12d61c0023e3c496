"""Analysis of finished runs, which never trains: evaluating and exporting a run's model (:mod:`~dfcil.analysis.
tools`), inspecting its features and inversions, reading run directories (:mod:`~dfcil.analysis.run_dirs`) into
reports and plots beside the papers' numbers (:mod:`~dfcil.analysis.paper`)."""
