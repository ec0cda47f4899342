"""The `pallas-course` command: site build and serving, and (with the exercises) nbgrader wrappers."""
