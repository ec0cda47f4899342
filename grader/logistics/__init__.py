"""The class's logistics: a submission's way to the grader and a grade's way back, with no
learner code run here: release, collect and the exchange's inbound entries, batches of
gradings on a local pool or a Dask cluster, grading on submit, and the class report."""
