"""The `pallas-course` command (``cli``) over three rooms: ``grading``, ``learner``, ``website``;
``tasks`` defines each task's cases and rules."""
