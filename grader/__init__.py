"""The `pallas-course` command: site build and serving, and the nbgrader wrappers."""
