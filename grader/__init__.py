"""The `pallas-course` command (``cli``) over the rooms a submission passes through in turn,
``logistics``, ``jail``, ``facts``, ``verdict`` and ``gradebook``, and the ``learner``'s and the
``website``'s rooms; ``tasks`` defines each task's cases and rules, and ``calling`` how a check
calls a learner's function."""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# Modules the exercise notebooks import, by the names they had before: a notebook released then
# keeps those lines in its locked set-up cell, and a learner's copy is never rewritten, so the
# old names stay the same module objects as the new ones, for good and without a warning.
MOVED = {"grader.course": "grader.learner.course", "grader.grading.calling": "grader.calling"}

# grader/grading/ before it was split into rooms (issue 49), by room. A class's course folder
# keeps the nbgrader_config.py it was set up with, which names some of these
# (deploy/setup-class.sh says so when it does), and an instructor's scripts may name others:
# they load the module at its new name with a FutureWarning until DEPRECATED_UNTIL, whose
# release removes them.
GRADING_ROOMS = {
    "logistics": ("batch", "build", "cluster", "collect", "hidden_tests", "inbound",
                  "on_submit", "releases", "report", "shared", "submission", "worker"),
    "jail": ("answer_cache", "checker", "exchange", "pids_cgroup", "relay", "replay",
             "sandbox", "trusted", "wire"),
    "facts": ("dma_order", "fingerprint", "gpu_facts", "work"),
    "verdict": ("messages", "refs", "remote_copies", "verdict"),
    "gradebook": ("feedback_css", "feedback_pp", "late", "roster"),
    "": ("integrity",),
}
DEPRECATED = {f"grader.grading.{m}": f"grader.{room}.{m}" if room else f"grader.{m}"
              for room, modules in GRADING_ROOMS.items() for m in modules}
DEPRECATED_UNTIL = "0.2.0"
# packages that are old names only: each an empty package whose modules MOVED or DEPRECATED
# name
OLD_PACKAGES = ("grader.grading",)
_OWN_SPECS: dict = {}  # a moved module's name -> its own spec, which an old name's import replaces


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``MOVED``'s and ``DEPRECATED``'s old names and loads each as the module at its new
    name, and ``OLD_PACKAGES`` as empty packages."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in OLD_PACKAGES:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        if fullname not in MOVED and fullname not in DEPRECATED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        if spec.name in OLD_PACKAGES:
            return None  # a new, empty module
        new = MOVED.get(spec.name) or DEPRECATED[spec.name]
        if spec.name in DEPRECATED:
            warnings.warn(f"{spec.name} is {new} since grader/grading/ was split into rooms; "
                          f"the old name goes in pallas-course {DEPRECATED_UNTIL}: name the new "
                          "one (a course's nbgrader_config.py: see deploy/setup-class.sh's "
                          "message)", FutureWarning, stacklevel=2)
        module = importlib.import_module(new)
        _OWN_SPECS[module.__name__] = module.__spec__  # the import sets the old name's on it
        return module

    def exec_module(self, module):
        if module.__spec__.name in OLD_PACKAGES:
            # the file that makes it: the jail's tamper check asks where a module comes from
            module.__file__ = __file__
            module.__doc__ = "Old names only: see grader/__init__.py's DEPRECATED."
            return
        module.__spec__ = _OWN_SPECS[module.__name__]  # already run under its new name: its own


if not any(isinstance(f, _MovedModule) for f in sys.meta_path):
    sys.meta_path.append(_MovedModule())
