"""The `pallas-course` command (``cli``) over three rooms: ``grading``, ``learner``, ``website``;
``tasks`` defines each task's cases and rules."""

import importlib
import importlib.abc
import importlib.util
import sys

# Modules the exercise notebooks import, by the names they had before grader/ had rooms: a
# notebook released then keeps those lines in its locked set-up cell, and a learner's copy is
# never rewritten, so the old names stay the same module objects as the new ones.
MOVED = {"grader.course": "grader.learner.course", "grader.calling": "grader.grading.calling"}


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``MOVED``'s old names and loads each as the module at its new name."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass  # already executed under its new name


if not any(isinstance(f, _MovedModule) for f in sys.meta_path):
    sys.meta_path.append(_MovedModule())
