"""The learner's tools: ``course.check``, ``pallas-course check``, hints, workspace, the copy."""
