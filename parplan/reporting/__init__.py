"""Reports of plans: printed tables and summaries (:mod:`~parplan.reporting.report`) and plots
(:mod:`~parplan.reporting.plot`)."""
