"""nbgrader in a learner's server on the hub: the shared exchange only (never the course)."""

import os

c = get_config()  # noqa: F821 - provided by traitlets when this file is loaded

c.CourseDirectory.course_id = "pallas-course"
c.Exchange.root = os.environ["PALLAS_COURSE_EXCHANGE"]
c.Exchange.path_includes_course = True
# the hub's user name is the student id, whatever Unix user the server runs as (a container's
# jovyan, or one account for all in a test)
c.CourseDirectory.student_id = os.environ["JUPYTERHUB_USER"]
