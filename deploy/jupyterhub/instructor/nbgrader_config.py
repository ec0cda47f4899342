"""nbgrader in an instructor's server on the hub: the course's own configuration (the course
folder, its gradebook, the jailed autograde), so the formgrader and `pallas-course` agree."""

import os

c = get_config()  # noqa: F821 - provided by traitlets when this file is loaded

load_subconfig("nbgrader_config.py", path=os.environ["PALLAS_COURSE_ROOT"])  # noqa: F821
