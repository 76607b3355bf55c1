"""Reports: what a run's result rows become for a reader.

* :mod:`~benchmarks.reports.report`: the paper-style Markdown tables and the run's provenance;
* :mod:`~benchmarks.reports.stats`: bootstrap confidence intervals (numpy, vectorised);
* :mod:`~benchmarks.reports.intervals`: intervals on a run's rows and their ratios to MAD;
* :mod:`~benchmarks.reports.plots`: score-against-tokens and scaling plots (matplotlib, Agg);
* :mod:`~benchmarks.reports.viewer`: the self-contained HTML episode viewer (written, not committed);
* :mod:`~benchmarks.reports.readme`: the README blocks suites regenerate.
"""
