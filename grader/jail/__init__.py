"""The jail: where a learner's code runs (a notebook's process and the checker, each in a
sandbox of its own) and what may cross out of it (framed answers, an allow-listed wire)."""
